//! One line for an error and its causes, as every role of vgpu-dra logs and reports them (the
//! kubelet's prepare answers, admission denials, logs).

/// The error's message followed by each cause, `: `-separated, each cause once: a layer whose
/// message already includes its cause's text does not repeat it.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let part = c.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("writing CDI spec /x")]
        Write(#[source] std::io::Error),
        #[error("reading claim: {0}")]
        Read(#[source] std::io::Error),
    }

    #[test]
    fn every_cause_once() {
        let io = || std::io::Error::other("Read-only file system");
        assert_eq!(error_chain(&Outer::Write(io())), "writing CDI spec /x: Read-only file system");
        assert_eq!(error_chain(&Outer::Read(io())), "reading claim: Read-only file system", "not repeated");
        assert_eq!(error_chain(&io()), "Read-only file system");
    }
}
