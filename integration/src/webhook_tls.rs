//! TLS for the admission webhooks of the components the test bed installs (Kueue, Volcano): the
//! API server calls them by URL on 127.0.0.1, trusting a CA made for the run.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The PEM of a CA named `ca_name`, made under `dir` with a serving certificate for 127.0.0.1
/// signed by it (`ca.crt`, `tls.crt`, `tls.key`: the names controller-runtime's and Volcano's
/// webhook servers read).
pub(crate) fn make_certificates(dir: &Path, ca_name: &str) -> anyhow::Result<String> {
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")?;
    let ca = format!(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN={ca_name}"
    );
    let steps = [
        ca.as_str(),
        "req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout tls.key -out tls.csr -subj /CN=127.0.0.1",
        "x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 2 -extfile san.ext",
    ];
    for step in steps {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(step.split(' '))
            .stdin(Stdio::null())
            .output()
            .context("running openssl")?;
        if !out.status.success() {
            bail!("openssl {step}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    Ok(std::fs::read_to_string(dir.join("ca.crt"))?)
}

/// A path as the `&str` a command line or a manifest wants.
pub(crate) fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().with_context(|| format!("{} is not UTF-8", p.display()))
}

/// Standard base64 with padding (a webhook's `caBundle`).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_pads_like_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
