//! HAMi-core's limits bind a container whatever user it runs as. A stand-in `libvgpu.so`
//! (`integration/testdata/libvgpu-stand-in.c`) is installed where the driver's `ld.so.preload`
//! points; a claim allocated by the real scheduler is prepared through the kubelet's own plugin
//! code; the reference CDI library turns its spec into container edits; and the test plays the
//! container runtime for what decides enforcement: the edits' mounts in a private mount namespace,
//! the container's user, exactly the edits' environment. The stand-in's constructor records what
//! ld.so made of it: if ld.so cannot read the preload file it loads nothing, silently, and the
//! container runs with no limit.
//!
//! Needs, beyond the test bed: root, a C compiler (`cc`), util-linux `unshare` and `setpriv`, and a
//! kernel that allows mount namespaces (and overlayfs where the host has no `/etc/ld.so.preload`
//! to mount over). A missing one fails the test by name; it never skips.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use common::{DRIVER, Dirs, NODE, card_uuid, cdi_check, claim_response, claim_with, driver};
use serde_json::Value;
use vgpu_dra_integration::node::build_stand_in;
use vgpu_dra_integration::{ControlPlane, KubeletSim, KubeletSimOptions};

/// `nobody`: stands for any user but root that a container runs as.
const NOBODY: u32 = 65534;
/// A dynamically linked program, so ld.so runs and reads the preload file.
const PROGRAM: &str = "/bin/true";

#[test]
fn a_container_of_any_user_loads_the_preload_with_its_claims_limits() {
    if let Err(e) = require_tools() {
        panic!("{e:#}");
    }
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    // The node's host directories apart from the plane's, which holds its admin token and keys:
    // these must be reachable by every user.
    let host = tempfile::Builder::new().prefix("vgpu-dra-host-").tempdir()?;
    let dirs = Dirs::new(host.path());
    open_test_dirs_to_all_users(host.path(), &dirs)?;
    build_stand_in(&dirs.vgpu.join("libvgpu.so"), &dirs.lock)?;
    let mut drv = driver(plane, &dirs, "driver");
    let registry = dirs.kubelet.join("plugins_registry");
    std::fs::create_dir_all(&registry)?;
    let mut kubelet = KubeletSim::start(&registry, DRIVER, &KubeletSimOptions { node_name: NODE.into(), ..Default::default() })?;
    kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER && e.get("error").is_none())?;

    kubectl.apply(&claim_with("enforced", "4Gi", "50"))?;
    plane.wait_allocated("default", "enforced", Duration::from_secs(30))?;
    let uid = kubectl.run(&["get", "resourceclaim", "enforced", "-o", "jsonpath={.metadata.uid}"])?;
    let reply = kubelet.prepare(&[("default", "enforced", &uid)])?;
    let response = claim_response(&reply, &uid);
    ensure!(response.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    drv.check_running()?;
    // Our spec's devices; the toolkit's (`nvidia.com/gpu=…`) live in a directory cdi-check is not given.
    let ids: Vec<&str> = response["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["cdi_device_ids"].as_array().into_iter().flatten().filter_map(Value::as_str))
        .filter(|id| id.starts_with(&format!("k8s.{DRIVER}/")))
        .collect();
    ensure!(!ids.is_empty(), "no CDI device of ours in {reply}");
    let edits = cdi_check(&dirs.cdi, &ids);
    let card = card_uuid(plane.kubectl(), "hami-gpu-0")?.context("no uuid attribute of hami-gpu-0 in the node's slices")?;

    let claim_dir = dirs.vgpu.join("claims").join(&uid);
    let env = edits_env(&edits);
    let cache = env.iter().find_map(|e| e.strip_prefix("CUDA_DEVICE_MEMORY_SHARED_CACHE=")).context("no shared cache")?;
    ensure!(Path::new(cache).parent() == Some(claim_dir.as_path()), "the shared cache {cache} is not in {}", claim_dir.display());

    // The modes first: they are the plain statement of what the runs below depend on.
    let mut problems = host_file_modes(&dirs, &claim_dir);
    for user in [0, NOBODY] {
        let out = run_as_container(&edits, user, &plane.dir().join(format!("runtime-{user}")))?;
        let want = [
            ("uid", user.to_string()),
            ("memory", "4096m".to_owned()),
            ("cores", "50".to_owned()),
            ("visible", card.clone()),
            ("cache", cache.to_owned()),
            ("lock", "ok".to_owned()),
        ];
        if let Err(e) = check_record(&claim_dir, user, &want) {
            problems.push(format!("uid {user}: {e}; the container's stderr: {:?}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    drv.check_running()?;
    ensure!(problems.is_empty(), "limits are not enforced for every container user:\n- {}", problems.join("\n- "));
    Ok(())
}

/// Fails, naming what is missing, when this machine cannot run the test.
fn require_tools() -> anyhow::Result<()> {
    for (tool, why) in [
        ("cc", "a C compiler, to build the libvgpu.so stand-in"),
        ("unshare", "util-linux unshare, for the container's private mount namespace"),
        ("setpriv", "util-linux setpriv, to run the container's program as another user"),
    ] {
        Command::new(tool).arg("--version").output().with_context(|| format!("`{tool}` is needed: {why}"))?;
    }
    let probe = Command::new("unshare").args(["--mount", "--propagation", "private", "true"]).output()?;
    ensure!(
        probe.status.success(),
        "`unshare --mount` fails ({}): the test needs root and a kernel that allows mount namespaces",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
    ensure!(Path::new(PROGRAM).is_file(), "{PROGRAM} is missing: it is the container's program");
    Ok(())
}

/// Makes the directories this test created traversable by any user, as a host's `/usr/local` is;
/// the directories the driver creates are left as it makes them, since their modes are under test.
fn open_test_dirs_to_all_users(root: &Path, dirs: &Dirs) -> anyhow::Result<()> {
    // tempfile makes its directories 0700; a real host's path to /usr/local/vgpu is 0755.
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
    std::fs::create_dir_all(&dirs.vgpu)?;
    std::fs::set_permissions(&dirs.vgpu, std::fs::Permissions::from_mode(0o755))?;
    for dir in root.ancestors().skip(1) {
        let mode = std::fs::metadata(dir)?.permissions().mode();
        ensure!(
            mode & 0o001 != 0,
            "uid {NOBODY} cannot traverse {} (mode {:o}): set TMPDIR to a directory every user can reach",
            dir.display(),
            mode & 0o7777
        );
    }
    Ok(())
}

fn edits_env(edits: &Value) -> Vec<String> {
    edits["env"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
}

/// What the runtime needs of the host files: a preload every user reads, and claim and lock
/// directories every user creates files in. One line per file that falls short.
fn host_file_modes(dirs: &Dirs, claim_dir: &Path) -> Vec<String> {
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o7777);
    let mut problems = Vec::new();
    let preload = dirs.vgpu.join("ld.so.preload");
    match mode(&preload) {
        Ok(0o644) => {}
        Ok(m) => problems.push(format!("{} has mode {m:04o}, not 0644: a non-root container cannot read it", preload.display())),
        Err(e) => problems.push(format!("{}: {e}", preload.display())),
    }
    let claims = dirs.vgpu.join("claims");
    for (dir, need, what) in
        [(claims.as_path(), 0o005, "read and traversed"), (claim_dir, 0o003, "written"), (dirs.lock.as_path(), 0o003, "written")]
    {
        match mode(dir) {
            Ok(m) if m & need == need => {}
            Ok(m) => problems.push(format!("{} has mode {m:04o}: it cannot be {what} by every user", dir.display())),
            Err(e) => problems.push(format!("{}: {e}", dir.display())),
        }
    }
    problems
}

/// Plays the container runtime: in a private mount namespace, bind-mounts every mount of `edits`
/// with its options, then runs [`PROGRAM`] as `uid` (and the same gid, no other groups) with
/// exactly the edits' environment. `scratch` is a directory of this test's.
///
/// # Errors
/// When the runtime's own steps fail (a mount, the user switch); what the program's ld.so did is
/// for the caller to read from the stand-in's record.
fn run_as_container(edits: &Value, uid: u32, scratch: &Path) -> anyhow::Result<Output> {
    let mut script = vec!["set -eu".to_owned()];
    let mounts = edits["mounts"].as_array().context("the edits have no mounts")?;
    let mut targets = Vec::new();
    for m in mounts {
        let (Some(source), Some(destination)) = (m["source"].as_str(), m["destination"].as_str()) else {
            bail!("mount without source or destination: {m}");
        };
        let options: Vec<&str> = m["options"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        ensure!(options.contains(&"bind"), "not a bind mount: {m}");
        targets.push((PathBuf::from(source), PathBuf::from(destination), options.join(",")));
    }
    ensure!(
        targets.iter().any(|(_, d, _)| d == Path::new("/etc/ld.so.preload")),
        "the edits do not mount /etc/ld.so.preload: {mounts:?}"
    );
    // A runtime creates missing mount targets in the container's root; the root here is the
    // host's, so they are made in an overlay of /etc that only this namespace sees.
    let missing: Vec<&(PathBuf, PathBuf, String)> = targets.iter().filter(|(_, d, _)| !d.exists()).collect();
    if !missing.is_empty() {
        std::fs::create_dir_all(scratch)?;
        let s = scratch.display();
        script.push(format!("mount -t tmpfs -o mode=0700 vgpu-dra-test {}", quote(&s.to_string())));
        script.push(format!("mkdir {} {}", quote(&format!("{s}/upper")), quote(&format!("{s}/work"))));
        script.push(format!(
            "mount -t overlay -o {} overlay /etc",
            quote(&format!("lowerdir=/etc,upperdir={s}/upper,workdir={s}/work"))
        ));
    }
    for (source, destination, _) in &missing {
        ensure!(destination.starts_with("/etc"), "mount target {} is missing on the host", destination.display());
        let make = if source.is_dir() { "mkdir -p" } else { "touch" };
        script.push(format!("{make} {}", quote(&destination.display().to_string())));
    }
    for (source, destination, options) in &targets {
        script.push(format!(
            "mount -o {} {} {}",
            quote(options),
            quote(&source.display().to_string()),
            quote(&destination.display().to_string())
        ));
    }
    let env: Vec<String> = edits_env(edits).iter().map(|e| quote(e)).collect();
    // `env -i` last, so only the program gets the claim's environment; setpriv drops the user.
    let switch = if uid == 0 { String::new() } else { format!("setpriv --reuid={uid} --regid={uid} --clear-groups -- ") };
    script.push(format!("exec {switch}env -i {} {PROGRAM}", env.join(" ")));
    let script = script.join("\n");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .context("running unshare")?;
    ensure!(
        out.status.success(),
        "playing the runtime for uid {uid} failed ({}):\n{script}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

/// Compares the stand-in's record of `uid` with `want`.
fn check_record(claim_dir: &Path, uid: u32, want: &[(&str, String)]) -> anyhow::Result<()> {
    let path = claim_dir.join(format!("stand-in-record.{uid}"));
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("no record at {}: ld.so did not load libvgpu.so, or it could not write the claim directory", path.display())
    })?;
    let record: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    for (key, value) in want {
        ensure!(record.get(key) == Some(&value.as_str()), "the record says {key}={:?}, not {value:?}", record.get(key));
    }
    Ok(())
}

/// `s` as one single-quoted shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
