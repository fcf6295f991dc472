//! Container images for a node of the test bed, written without a registry or a container engine
//! by `integration/k8s/build-image.sh` as OCI layouts in tar archives (`ctr images import` loads
//! them), and what an image's config says, read from such an archive or from a Dockerfile, so a
//! test can check that the image built here is laid out as the repository's `Dockerfile` says.
//!
//! Only what the test bed needs: one-layer archives as the script writes them, and the
//! instructions of a Dockerfile's last stage that shape how the image runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// Where the chart's install container finds HAMi-core's library by default
/// (`hamiCore.installFrom`), and where [`hami_core_image`] puts it.
pub const HAMI_CORE_INSTALL_FROM: &str = "/k8s-vgpu/lib/nvidia/libvgpu.so";

/// How an image runs, as its config (or a Dockerfile) says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageConfig {
    /// `Entrypoint` / `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
    /// `Cmd` / `CMD` (exec form).
    pub cmd: Vec<String>,
    /// `User` / `USER`; empty when unset.
    pub user: String,
    /// `Env` / `ENV`, as `KEY=VALUE`; a Dockerfile's holds only what its last stage sets.
    pub env: Vec<String>,
    /// The program the image holds to run: in an archive the first element of the entrypoint (of
    /// the command when there is none), in a Dockerfile the destination of the last `COPY --from`.
    pub binary: String,
}

impl ImageConfig {
    /// Checks that this image's config says what `dockerfile`'s says: the same entrypoint,
    /// command, user and binary, and every environment entry the Dockerfile sets.
    ///
    /// # Errors
    /// One message naming every field that differs.
    pub fn check_matches(&self, dockerfile: &ImageConfig) -> anyhow::Result<()> {
        let mut differences = Vec::new();
        let mut compare = |field: &str, image: String, file: String| {
            if image != file {
                differences.push(format!("{field}: image {image}, Dockerfile {file}"));
            }
        };
        compare("entrypoint", format!("{:?}", self.entrypoint), format!("{:?}", dockerfile.entrypoint));
        compare("cmd", format!("{:?}", self.cmd), format!("{:?}", dockerfile.cmd));
        compare("user", format!("{:?}", self.user), format!("{:?}", dockerfile.user));
        compare("binary", format!("{:?}", self.binary), format!("{:?}", dockerfile.binary));
        for entry in dockerfile.env.iter().filter(|e| !self.env.contains(e)) {
            differences.push(format!("env: image lacks {entry:?} (has {:?})", self.env));
        }
        ensure!(differences.is_empty(), "the image's config differs from the Dockerfile's: {}", differences.join("; "));
        Ok(())
    }
}

/// Writes the driver's image from `binary` (debug info stripped, with the C libraries it loads)
/// as `name` into `out_dir`, laid out as the repository's `Dockerfile` says; returns the archive.
///
/// # Errors
/// When `build-image.sh` fails (a missing binary, `objcopy` or `ldd`).
pub fn driver_image(binary: &Path, name: &str, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let out = out_dir.join(archive_name(name));
    build_image(&[binary.as_os_str(), name.as_ref(), out.as_os_str()])?;
    Ok(out)
}

/// Writes a HAMi-core install image as `name` into `out_dir`: the test bed's busybox image (for
/// the chart's `sh -c "cp ... && mv ..."`) plus `stand_in` at [`HAMI_CORE_INSTALL_FROM`];
/// returns the archive.
///
/// # Errors
/// When the busybox image cannot be built or `build-image.sh` fails.
pub fn hami_core_image(stand_in: &Path, name: &str, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let busybox = &crate::node::node_components()?.busybox_image;
    let out = out_dir.join(archive_name(name));
    build_image(&["--hami-core".as_ref(), stand_in.as_os_str(), busybox.as_os_str(), name.as_ref(), out.as_os_str()])?;
    Ok(out)
}

/// A file name for image `name`: its reference with what a path cannot hold replaced.
fn archive_name(name: &str) -> String {
    let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
    format!("{safe}.tar")
}

fn build_image(args: &[&std::ffi::OsStr]) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/build-image.sh");
    let out = Command::new(&script).args(args).output().with_context(|| format!("running {}", script.display()))?;
    ensure!(out.status.success(), "{} failed: {}", script.display(), String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// The config of the first image that OCI archive `archive`'s index names.
///
/// # Errors
/// When the archive cannot be read or lacks the index, the manifest or the config.
pub fn archive_config(archive: &Path) -> anyhow::Result<ImageConfig> {
    let manifest = manifest(archive)?;
    let digest = manifest["config"]["digest"].as_str().context("the manifest names no config")?;
    let blob: Value = serde_json::from_slice(&archive_member(archive, &blob_path(digest)?)?)
        .with_context(|| format!("parsing config {digest}"))?;
    let config = &blob["config"];
    let strings = |key: &str| -> anyhow::Result<Vec<String>> {
        match &config[key] {
            Value::Null => Ok(Vec::new()),
            value => serde_json::from_value(value.clone()).with_context(|| format!("config {key} is not a list of strings")),
        }
    };
    let entrypoint = strings("Entrypoint")?;
    let cmd = strings("Cmd")?;
    let binary = entrypoint.first().or(cmd.first()).cloned().context("the config has neither Entrypoint nor Cmd")?;
    Ok(ImageConfig {
        user: config["User"].as_str().unwrap_or_default().to_owned(),
        env: strings("Env")?,
        entrypoint,
        cmd,
        binary,
    })
}

/// Every path in OCI archive `archive`'s first image, over all its layers, as an absolute
/// path without a trailing slash (`/usr/bin/vgpu-dra`, `/tmp`).
///
/// # Errors
/// When the archive or a layer cannot be read.
pub fn layer_paths(archive: &Path) -> anyhow::Result<Vec<String>> {
    let mut paths = Vec::new();
    for digest in layer_digests(archive)? {
        let list = through_layer(archive, &digest, &["-t"])?;
        ensure!(list.status.success(), "listing layer {digest}: {}", String::from_utf8_lossy(&list.stderr).trim());
        for entry in String::from_utf8_lossy(&list.stdout).lines() {
            let path = entry.trim_start_matches('.').trim_end_matches('/');
            paths.push(if path.starts_with('/') { path.to_owned() } else { format!("/{path}") });
        }
    }
    Ok(paths)
}

/// The bytes of file `path` (absolute, as [`layer_paths`] gives it) in OCI archive `archive`'s
/// first image, from the last layer that holds it.
///
/// # Errors
/// When the archive cannot be read or no layer holds the file.
pub fn layer_file(archive: &Path, path: &str) -> anyhow::Result<Vec<u8>> {
    let member = format!(".{path}");
    for digest in layer_digests(archive)?.iter().rev() {
        let file = through_layer(archive, digest, &["-xO", &member])?;
        if file.status.success() {
            return Ok(file.stdout);
        }
    }
    bail!("no layer of {} holds {path}", archive.display())
}

/// The digests of the first image's layers, bottom first.
fn layer_digests(archive: &Path) -> anyhow::Result<Vec<String>> {
    let manifest = manifest(archive)?;
    let layers = manifest["layers"].as_array().context("the manifest names no layers")?;
    layers.iter().map(|l| l["digest"].as_str().map(str::to_owned).context("a layer without a digest")).collect()
}

/// Runs `tar args` on layer `digest` of `archive`, streamed from one tar into the other (a
/// driver layer is ~80 MB); the second tar's output, whatever its status.
fn through_layer(archive: &Path, digest: &str, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let mut extract = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(blob_path(digest)?)
        .stdout(Stdio::piped())
        .spawn()
        .context("running tar")?;
    let stdout = extract.stdout.take().context("tar's output")?;
    let out = Command::new("tar").args(args).stdin(stdout).output().with_context(|| format!("running tar {}", args.join(" ")))?;
    // The second tar reads its input to the end (it looks for more members), so the first
    // one fails only when the layer cannot be read.
    ensure!(extract.wait()?.success(), "extracting layer {digest} from {}", archive.display());
    Ok(out)
}

fn manifest(archive: &Path) -> anyhow::Result<Value> {
    let index: Value = serde_json::from_slice(&archive_member(archive, "index.json")?).context("parsing index.json")?;
    let digest = index["manifests"][0]["digest"].as_str().context("index.json names no manifest")?;
    serde_json::from_slice(&archive_member(archive, &blob_path(digest)?)?).with_context(|| format!("parsing manifest {digest}"))
}

/// Where an OCI layout keeps the blob of `digest`; refuses anything that is not `sha256:<hex>`,
/// which would name another path.
fn blob_path(digest: &str) -> anyhow::Result<String> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(format!("blobs/sha256/{hex}"))
        }
        _ => bail!("unexpected digest {digest:?}"),
    }
}

fn archive_member(archive: &Path, member: &str) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("tar").arg("-xOf").arg(archive).arg(member).output().context("running tar")?;
    ensure!(out.status.success(), "{} has no {member}: {}", archive.display(), String::from_utf8_lossy(&out.stderr).trim());
    Ok(out.stdout)
}

/// How the last stage of a Dockerfile runs: its `ENV`, `USER`, `ENTRYPOINT` and `CMD` (exec
/// form), and the destination of its last `COPY --from` as the binary.
///
/// # Errors
/// When there is no `FROM`, or the last stage lacks `ENTRYPOINT`, `CMD`, `USER` or `COPY
/// --from` (what the base image says instead is unknown here), or uses a form not read here.
pub fn dockerfile_config(dockerfile_text: &str) -> anyhow::Result<ImageConfig> {
    let lines = instructions(dockerfile_text);
    let from = lines.iter().rposition(|(keyword, _)| keyword == "FROM").context("the Dockerfile has no FROM")?;
    let (mut entrypoint, mut cmd, mut user, mut binary, mut env) = (None, None, None, None, Vec::new());
    for (keyword, rest) in &lines[from + 1..] {
        match keyword.as_str() {
            "ENV" => {
                for entry in env_entries(rest)? {
                    let key = entry.split('=').next().unwrap_or_default();
                    env.retain(|e: &String| e.split('=').next() != Some(key));
                    env.push(entry);
                }
            }
            "USER" => user = Some(rest.clone()),
            "ENTRYPOINT" => entrypoint = Some(exec_form("ENTRYPOINT", rest)?),
            "CMD" => cmd = Some(exec_form("CMD", rest)?),
            "COPY" if rest.split_whitespace().any(|w| w.starts_with("--from=")) => {
                binary = rest.split_whitespace().last().map(str::to_owned);
            }
            _ => {}
        }
    }
    let missing = |what: &str| format!("the Dockerfile's last stage has no {what}");
    Ok(ImageConfig {
        entrypoint: entrypoint.with_context(|| missing("ENTRYPOINT"))?,
        cmd: cmd.with_context(|| missing("CMD"))?,
        user: user.with_context(|| missing("USER"))?,
        binary: binary.with_context(|| missing("COPY --from"))?,
        env,
    })
}

/// The Dockerfile's instructions as (upper-case keyword, arguments), continuation lines joined and
/// comments dropped.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                let joined = std::mem::take(&mut current);
                let joined = joined.trim();
                if !joined.is_empty() {
                    let (keyword, rest) = joined.split_once(char::is_whitespace).unwrap_or((joined, ""));
                    out.push((keyword.to_ascii_uppercase(), rest.trim().to_owned()));
                }
            }
        }
    }
    out
}

fn exec_form(keyword: &str, rest: &str) -> anyhow::Result<Vec<String>> {
    serde_json::from_str(rest).with_context(|| format!("{keyword} {rest}: only the JSON (exec) form is read"))
}

/// `ENV KEY=VALUE...` (values may be double-quoted) or the older `ENV KEY VALUE`.
fn env_entries(rest: &str) -> anyhow::Result<Vec<String>> {
    if let Some((key, value)) = rest.split_once(char::is_whitespace)
        && !key.contains('=')
    {
        return Ok(vec![format!("{key}={}", value.trim())]);
    }
    let mut entries = Vec::new();
    let mut chars = rest.trim().chars().peekable();
    while chars.peek().is_some() {
        let mut entry = String::new();
        let mut quoted = false;
        for c in chars.by_ref() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => break,
                c => entry.push(c),
            }
        }
        ensure!(!quoted, "ENV {rest}: unterminated quote");
        ensure!(entry.contains('='), "ENV {rest}: {entry:?} is not KEY=VALUE");
        entries.push(entry);
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"FROM rust:1 AS build
COPY . .
USER builder
ENV IN_BUILD=1
ENTRYPOINT ["/bin/false"]

# The runtime stage.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
copy --from=build --chmod=755 /src/target/release/vgpu-dra \
     /usr/bin/vgpu-dra
ENV MALLOC_ARENA_MAX=1 GREETING="hello world"
ENV LEGACY some value
# A comment between instructions.
USER 0:0
ENTRYPOINT ["/usr/bin/vgpu-dra"]
CMD ["kubelet-plugin"]
"#;

    fn sample() -> ImageConfig {
        ImageConfig {
            entrypoint: vec!["/usr/bin/vgpu-dra".into()],
            cmd: vec!["kubelet-plugin".into()],
            user: "0:0".into(),
            env: vec!["MALLOC_ARENA_MAX=1".into(), "GREETING=hello world".into(), "LEGACY=some value".into()],
            binary: "/usr/bin/vgpu-dra".into(),
        }
    }

    #[test]
    fn reads_the_last_stage() {
        assert_eq!(dockerfile_config(SAMPLE).unwrap(), sample());
    }

    #[test]
    fn a_mismatch_names_each_field() {
        let mut image = sample();
        image.cmd = vec!["webhook".into()];
        image.env = vec!["PATH=/usr/bin".into(), "GREETING=hello world".into(), "LEGACY=some value".into()];
        let err = image.check_matches(&sample()).unwrap_err().to_string();
        assert!(err.contains(r#"cmd: image ["webhook"], Dockerfile ["kubelet-plugin"]"#), "{err}");
        assert!(err.contains("MALLOC_ARENA_MAX=1"), "{err}");
        assert!(!err.contains("entrypoint"), "{err}");
        let mut with_path = sample();
        with_path.env.insert(0, "PATH=/usr/bin".into());
        with_path.check_matches(&sample()).unwrap();
    }

    #[test]
    fn names_what_is_missing() {
        let without_cmd = SAMPLE.replace(r#"CMD ["kubelet-plugin"]"#, "");
        assert!(dockerfile_config(&without_cmd).unwrap_err().to_string().contains("no CMD"));
        let shell_form = SAMPLE.replace(r#"["/usr/bin/vgpu-dra"]"#, "/usr/bin/vgpu-dra");
        assert!(dockerfile_config(&shell_form).unwrap_err().to_string().contains("exec"));
        assert!(dockerfile_config("# nothing\n").unwrap_err().to_string().contains("no FROM"));
    }

    #[test]
    fn archive_names_are_paths() {
        assert_eq!(archive_name("vgpu-dra.test/vgpu-dra:1"), "vgpu-dra.test_vgpu-dra_1.tar");
    }
}
