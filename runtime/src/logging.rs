//! Logging to stderr, filtered by `RUST_LOG` (default `info`).

/// `RUST_LOG` does not parse.
#[derive(Debug, thiserror::Error)]
#[error("RUST_LOG={spec:?}")]
pub struct LogFilterError {
    /// The filter given.
    pub spec: String,
    /// Why it does not parse.
    #[source]
    pub source: tracing_subscriber::filter::ParseError,
}

/// Sets up logging from `RUST_LOG`, as JSON lines when `json`; a bad filter fails fast. Colours
/// only when stderr is a terminal: log collectors store the escape codes verbatim. A second call
/// keeps the first set-up (tests that run a role twice).
///
/// # Errors
/// When the filter does not parse.
pub fn init(json: bool) -> Result<(), LogFilterError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) => tracing_subscriber::EnvFilter::try_new(&spec).map_err(|source| LogFilterError { spec, source })?,
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
    Ok(())
}
