//! Client certificates of the test bed's control plane, as a cluster has them: the API server
//! trusts one client CA, each kubelet authenticates as `system:node:<name>` in `system:nodes`
//! (so the Node authorizer and NodeRestriction apply to it), and the API server presents a
//! certificate of its own to the kubelets, which authorize it through the API.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// A CA made for one run, with the files it signs in its directory.
#[derive(Debug, Clone)]
pub struct ClientCa {
    dir: PathBuf,
}

impl ClientCa {
    /// Makes the CA `name` in `dir` (`ca.crt`, `ca.key`).
    ///
    /// # Errors
    /// When openssl fails (its message is quoted).
    pub fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
            ],
        )?;
        Ok(Self { dir: dir.to_owned() })
    }

    /// The CA's certificate.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A client certificate and key for user `cn` in group `group`, named `<stem>.crt` and
    /// `<stem>.key`.
    ///
    /// # Errors
    /// When openssl fails.
    pub fn issue(&self, stem: &str, cn: &str, group: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let (key, csr, crt) = (format!("{stem}.key"), format!("{stem}.csr"), format!("{stem}.crt"));
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/O={group}/CN={cn}"),
            ],
        )?;
        std::fs::write(self.dir.join(format!("{stem}.ext")), "extendedKeyUsage=clientAuth\n")?;
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &format!("{stem}.ext"),
            ],
        )?;
        Ok((self.dir.join(crt), self.dir.join(key)))
    }
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl").current_dir(dir).args(args).stdin(Stdio::null()).output().context("running openssl")?;
    if !out.status.success() {
        bail!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Writes a kubeconfig for `server` that authenticates with the client certificate `cert`/`key`.
///
/// # Errors
/// When the file cannot be written.
pub fn write_cert_kubeconfig(path: &Path, server: &str, cert: &Path, key: &Path) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n\
users:\n- name: user\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\n",
        cert.display(),
        key.display()
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
