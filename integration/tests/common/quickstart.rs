//! docs/quickstart.md's install steps, as the helm install test runs them on the real node and as
//! the docs test checks they still read: the `sh` block of "## 1. Install", with the placeholders
//! a reader replaces ([`PLACEHOLDERS`]) replaced.

use std::path::Path;

use anyhow::{Context, ensure};

/// What a reader of the install block puts in (the test: its own node, image and CA), each with
/// what the block says there.
pub const PLACEHOLDERS: [(&str, &str); 5] = [
    ("node", "gpu-node-1"),
    ("image repository", "registry.example.com/vgpu-dra"),
    ("image tag", "0.1.0"),
    ("HAMi-core image", "projecthami/hami:v2.7.0"),
    ("webhook client CA", "\"$WEBHOOK_CLIENT_CA\""),
];

/// The install block's text.
///
/// # Errors
/// When docs/quickstart.md has no "## 1. Install" section with an `sh` block.
pub fn install_block() -> anyhow::Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/quickstart.md");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let section = text.split("\n## ").find(|s| s.starts_with("1. Install")).context("quickstart.md has no \"## 1. Install\"")?;
    let start = section.find("```sh\n").context("\"## 1. Install\" has no ```sh block")? + "```sh\n".len();
    let end = section[start..].find("```").context("the install block does not end")?;
    let block = section[start..start + end].to_owned();
    for (what, text) in PLACEHOLDERS {
        ensure!(block.contains(text), "the install block no longer names the {what} as {text}:\n{block}");
    }
    Ok(block)
}

/// The install block with each placeholder replaced by `values` (in [`PLACEHOLDERS`]' order) and
/// `extra` added to `helm install`'s options (the mock inventory the section tells GPU-less
/// clusters to add).
///
/// # Errors
/// As [`install_block`].
pub fn install_commands(values: [&str; 5], extra: &str) -> anyhow::Result<String> {
    let mut block = install_block()?;
    for ((_, placeholder), value) in PLACEHOLDERS.iter().zip(values) {
        block = block.replace(placeholder, value);
    }
    Ok(block.replacen("helm install ", &format!("helm install {extra} "), 1))
}
