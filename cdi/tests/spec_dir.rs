//! Spec files written by `SpecDir`: atomic replacement, listing, and read-back of every spec
//! shape the driver emits through the reference Rust CDI implementation.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use cdi_spec::{ContainerEdits, Device, DeviceNode, Durability, Hook, Kind, Mount, Spec, SpecDir};

fn kind() -> Kind {
    Kind::parse("k8s.hami-core-gpu.project-hami.io/claim").unwrap()
}

/// The shape the kubelet plugin writes for one claim: limits, preload, device nodes.
fn claim_spec(claim_uid: &str, devices: &[(&str, u32)]) -> Spec {
    let devices = devices
        .iter()
        .map(|(name, minor)| Device {
            name: format!("{claim_uid}-{name}"),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits {
                env: vec![
                    "CUDA_DEVICE_MEMORY_LIMIT_0=4096m".into(),
                    "CUDA_DEVICE_SM_LIMIT=50".into(),
                    format!("CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/{claim_uid}/GPU-x.cache"),
                ],
                device_nodes: vec![
                    DeviceNode {
                        path: format!("/dev/nvidia{minor}"),
                        kind: Some("c".into()),
                        major: Some(195),
                        minor: Some(i64::from(*minor)),
                        permissions: Some("rw".into()),
                        ..Default::default()
                    },
                    DeviceNode {
                        path: "/dev/nvidiactl".into(),
                        kind: Some("c".into()),
                        major: Some(195),
                        minor: Some(255),
                        ..Default::default()
                    },
                ],
                mounts: vec![
                    Mount {
                        host_path: "/usr/local/vgpu/libvgpu.so".into(),
                        container_path: "/usr/local/vgpu/libvgpu.so".into(),
                        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
                        kind: None,
                    },
                    Mount {
                        host_path: "/usr/local/vgpu/ld.so.preload".into(),
                        container_path: "/etc/ld.so.preload".into(),
                        options: vec!["ro".into(), "bind".into()],
                        kind: None,
                    },
                ],
                ..Default::default()
            },
        })
        .collect();
    Spec::new(&kind(), devices).unwrap()
}

/// Loads a file through the reference implementation's parser and schema validation.
fn read_back(path: &PathBuf) -> Vec<String> {
    let spec = container_device_interface::spec::read_spec(path, 0)
        .unwrap_or_else(|e| panic!("reference CDI rejected {}: {e:#}\n{}", path.display(), fs::read_to_string(path).unwrap()));
    spec.get_devices().into_keys().collect()
}

#[test]
fn every_emitted_shape_reads_back_through_the_reference_implementation() {
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path(), kind());
    // Digit-first claim UID (needs 0.5.0), two devices, letter-first UID.
    let shapes = [
        ("0b7e2c4a-1111-4222-8333-444455556666", claim_spec("0b7e2c4a-1111-4222-8333-444455556666", &[("hami-gpu-0", 0)])),
        ("a1", claim_spec("a1", &[("hami-gpu-0", 0), ("hami-gpu-1", 1)])),
        ("b2", {
            let mut s = claim_spec("b2", &[("hami-gpu-3", 3)]);
            s.devices[0].container_edits.hooks.push(Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/true".into(),
                args: vec!["true".into()],
                ..Default::default()
            });
            s.devices[0].container_edits.additional_gids.push(44);
            s.annotations.insert("vgpu-dra/claim".into(), "ns/name".into());
            s.set_minimum_version();
            s
        }),
    ];
    for (id, spec) in &shapes {
        let path = specs.write(id, spec).unwrap();
        let names = read_back(&path);
        let expected: Vec<String> = spec.devices.iter().map(|d| d.name.clone()).collect();
        assert_eq!(names, expected);
        assert_eq!(specs.read(id).unwrap().as_ref(), Some(spec));
    }
    assert_eq!(shapes[0].1.cdi_version, "0.5.0");
    assert_eq!(shapes[1].1.cdi_version, "0.3.0");
    assert_eq!(shapes[2].1.cdi_version, "0.7.0");
}

#[test]
fn crash_between_temp_write_and_rename_leaves_the_old_spec() {
    for durability in [Durability::Durable, Durability::Rebuildable] {
        crash_between_temp_write_and_rename(durability);
    }
}

/// Durability changes what a power loss keeps, never what a running reader or a crash sees.
fn crash_between_temp_write_and_rename(durability: Durability) {
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path(), kind()).with_durability(durability);
    let old = claim_spec("c1", &[("hami-gpu-0", 0)]);
    let path = specs.write("c1", &old).unwrap();
    let before = fs::read(&path).unwrap();

    let new = claim_spec("c1", &[("hami-gpu-0", 0), ("hami-gpu-1", 1)]);
    let temp = specs.stage("c1", &new).unwrap().abandon();
    assert!(temp.exists(), "the crash left its temp file");
    assert_eq!(fs::read(&path).unwrap(), before, "the visible spec is the old one, byte for byte");
    assert_eq!(read_back(&path), ["c1-hami-gpu-0"]);
    // Runtimes only load *.json / *.yaml: the temp file is invisible to them and to our listing.
    assert_eq!(specs.list_owned().unwrap().len(), 1);
    assert_eq!(specs.remove_stale_temps().unwrap(), 1);
    assert!(!temp.exists());

    // The next write goes through in full; a dropped stage leaves nothing.
    drop(specs.stage("c1", &old).unwrap());
    specs.write("c1", &new).unwrap();
    assert_eq!(read_back(&path), ["c1-hami-gpu-0", "c1-hami-gpu-1"]);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "{durability:?}: only the spec is left");
    assert!(specs.remove("c1").unwrap());
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "{durability:?}");
}

#[test]
fn a_reserved_temp_file_is_invisible_and_fills_only_in_its_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path().join("cdi"), kind());
    let other = SpecDir::new(dir.path().join("other"), kind());
    let spec = claim_spec("c1", &[("hami-gpu-0", 0)]);
    let reserved = specs.reserve().unwrap();
    assert!(specs.list_owned().unwrap().is_empty(), "an empty temp file is no spec");
    let err = other.stage_in(specs.reserve().unwrap(), "c1", &spec).unwrap_err();
    assert!(
        matches!(&err, cdi_spec::SpecDirError::Write { source, .. } if source.kind() == std::io::ErrorKind::InvalidInput),
        "{err:?}"
    );
    assert!(!other.path().exists(), "nothing was written where the file was not made");
    assert_eq!(fs::read_dir(specs.path()).unwrap().count(), 1, "only the first reservation is left");
    assert!(matches!(specs.stage_in(specs.reserve().unwrap(), "../c1", &spec), Err(cdi_spec::SpecDirError::BadId { .. })));
    let path = specs.stage_in(reserved, "c1", &spec).unwrap().commit().unwrap();
    assert_eq!(read_back(&path), ["c1-hami-gpu-0"]);
    assert_eq!(fs::read_dir(specs.path()).unwrap().count(), 1, "the temp file became the spec");
    drop(specs.reserve().unwrap());
    assert_eq!(fs::read_dir(specs.path()).unwrap().count(), 1, "a dropped reservation leaves nothing");
}

#[test]
fn listing_sees_only_this_drivers_specs_and_remove_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path(), kind());
    specs.write("z9", &claim_spec("z9", &[("hami-gpu-0", 0)])).unwrap();
    specs.write("a0", &claim_spec("a0", &[("hami-gpu-0", 0)])).unwrap();
    fs::write(dir.path().join("nvidia.com-gpu.json"), "{}").unwrap();
    fs::write(dir.path().join("k8s.other.io-claim_x.json"), "{}").unwrap();
    let ids: Vec<String> = specs.list_owned().unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["a0", "z9"]);
    assert!(specs.remove("a0").unwrap());
    assert!(!specs.remove("a0").unwrap());
    assert!(dir.path().join("nvidia.com-gpu.json").exists());
    let missing = SpecDir::new(dir.path().join("absent"), kind());
    assert!(missing.list_owned().unwrap().is_empty());
}

#[test]
fn ids_that_could_escape_the_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path(), kind());
    for bad in ["../etc/passwd", "a/b", "", ".hidden", "x\0y"] {
        let err = specs.write(bad, &claim_spec("a", &[("hami-gpu-0", 0)])).unwrap_err();
        assert!(err.to_string().contains("not a safe file name"), "{bad:?}: {err}");
    }
}

#[test]
fn the_reference_reader_rejects_a_spec_whose_version_is_too_low() {
    // Guards the read-back above: it must be able to fail.
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path(), kind());
    let mut spec = claim_spec("0abc", &[("hami-gpu-0", 0)]);
    spec.cdi_version = "0.3.0".into();
    let path = specs.write("0abc", &spec).unwrap();
    assert!(container_device_interface::spec::read_spec(&path, 0).is_err());
}

#[test]
fn anything_but_a_regular_file_under_our_names_is_reported_never_read_or_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = SpecDir::new(tmp.path(), kind());
    dir.write("u-good", &claim_spec("u-good", &[("hami-gpu-0", 0)])).unwrap();
    let stem = kind().file_stem();
    fs::create_dir(tmp.path().join(format!("{stem}_u-dir.json"))).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), tmp.path().join(format!("{stem}_u-link.json"))).unwrap();
    let fifo = tmp.path().join(format!("{stem}_u-fifo.json"));
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    fs::create_dir(tmp.path().join(".cdi-tmp-dir")).unwrap();
    fs::write(tmp.path().join(format!("{stem}_u-huge.json")), vec![b' '; 2 << 20]).unwrap();

    let scan = dir.scan().unwrap();
    let owned: Vec<&str> = scan.owned.iter().map(|s| s.id.as_str()).collect();
    assert!(owned.contains(&"u-good"), "{owned:?}");
    let mut ignored: Vec<&str> = scan.ignored.iter().map(|e| e.what).collect();
    ignored.sort_unstable();
    assert_eq!(ignored, ["FIFO", "directory", "symbolic link"]);
    // Reading any of them errors at once (a FIFO would block a plain read forever).
    for id in ["u-dir", "u-link", "u-fifo", "u-huge"] {
        assert!(dir.read(id).is_err(), "{id}");
    }
    assert!(dir.read("u-good").unwrap().is_some());
    // A directory under the temp prefix is not ours to delete.
    assert_eq!(dir.remove_stale_temps().unwrap(), 0);
    assert!(tmp.path().join(".cdi-tmp-dir").is_dir());
}

#[test]
fn a_reserved_temp_file_knows_when_its_directory_was_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(dir.path().join("cdi"), kind());
    let reserved = specs.reserve().unwrap();
    assert!(reserved.still_there());
    // What a reboot or an admin does to /var/run/cdi.
    for entry in fs::read_dir(dir.path().join("cdi")).unwrap() {
        fs::remove_file(entry.unwrap().path()).unwrap();
    }
    assert!(!reserved.still_there());
    let fresh = specs.reserve().unwrap();
    assert!(fresh.still_there());
    specs.stage_in(fresh, "c1", &claim_spec("c1", &[("hami-gpu-0", 0)])).unwrap().commit().unwrap();
    assert_eq!(specs.read("c1").unwrap(), Some(claim_spec("c1", &[("hami-gpu-0", 0)])));
}
