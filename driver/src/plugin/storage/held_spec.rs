//! What the driver holds of a prepared claim's CDI spec between prepare and unprepare: the
//! environment its containers get, as JSON text in one allocation, and a digest of the whole
//! spec. The whole spec (mounts, device nodes, annotations: three quarters of its 1.2 KiB) is
//! in the claim's checkpoint record on disk, and is read back from there in the one case that
//! needs it, rewriting a spec file the CDI directory lost or that was changed (BENCHMARKS.md,
//! issue 35). The digest tells whether a spec file on disk is the one prepared, without that
//! read, and that the record read back still holds the spec prepared.
//!
//! The environment is read back by the claim's directory, its status and the monitor.

use cdi_spec::Spec;
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// What is held of a claim's CDI spec: its containers' env and its digest.
#[derive(Clone)]
pub struct HeldSpec {
    /// The spec's `containerEdits.env`, as a compact JSON array.
    env: Box<RawValue>,
    /// SHA-256 of the spec's compact JSON.
    digest: [u8; 32],
}

/// The held text is not an env: only a bug can cause it, since only a spec's env is held.
#[derive(Debug, thiserror::Error)]
#[error("the CDI spec env held for the claim does not read back")]
pub struct HeldSpecError(#[from] serde_json::Error);

/// SHA-256 of `spec`'s compact JSON, which has one form (fields in declaration order, maps
/// sorted).
fn digest(spec: &Spec) -> [u8; 32] {
    // A spec is strings, numbers, sequences and string-keyed maps: its JSON cannot fail.
    let json = serde_json::to_vec(spec).expect("a CDI spec always has a JSON form");
    Sha256::digest(&json).into()
}

impl HeldSpec {
    /// Holds what is kept of `spec`.
    pub fn new(spec: &Spec) -> Self {
        let env = serde_json::value::to_raw_value(&spec.container_edits.env).expect("an env always has a JSON form");
        Self { env, digest: digest(spec) }
    }

    /// The environment the spec gives every container (its `containerEdits.env`; a device's
    /// own env is not every container's).
    ///
    /// # Errors
    /// [`HeldSpecError`] if the text does not read back.
    pub fn env(&self) -> Result<Vec<String>, HeldSpecError> {
        Ok(Vec::<String>::deserialize(&*self.env)?)
    }

    /// Whether `spec` is the spec held: the same JSON, by its digest.
    pub fn is(&self, spec: &Spec) -> bool {
        digest(spec) == self.digest
    }
}

impl PartialEq for HeldSpec {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest && self.env.get() == other.env.get()
    }
}

impl Eq for HeldSpec {}

impl std::fmt::Debug for HeldSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest: String = self.digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        f.debug_struct("HeldSpec").field("env", &self.env.get()).field("digest", &digest).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdi_spec::{ContainerEdits, Device, Kind, Mount};

    fn spec() -> Spec {
        let kind = Kind::parse("k8s.x.io/claim").unwrap();
        let device = Device {
            name: "gpu-0".into(),
            annotations: Default::default(),
            container_edits: ContainerEdits { env: vec!["A=1".into()], ..Default::default() },
        };
        let mut spec = Spec::new(&kind, vec![device]).unwrap();
        spec.annotations.insert("z".into(), "last".into());
        spec.annotations.insert("a".into(), "first".into());
        spec.container_edits.env = vec!["CUDA_DEVICE_MEMORY_LIMIT_0=4096m".into(), "X=\"quoted\" \\ é".into()];
        spec.container_edits.mounts = vec![Mount {
            host_path: "/usr/local/vgpu/libvgpu.so".into(),
            container_path: "/usr/local/vgpu/libvgpu.so".into(),
            options: vec!["ro".into(), "nosuid".into(), "bind".into()],
            kind: None,
        }];
        spec
    }

    #[test]
    fn a_held_spec_is_its_spec_and_no_other() {
        let held = HeldSpec::new(&spec());
        assert!(held.is(&spec()));
        assert_eq!(held, HeldSpec::new(&spec()));
        // Every part counts, not only the env that is kept in full.
        let changes: [fn(&mut Spec); 5] = [
            |s| drop(s.container_edits.env.pop()),
            |s| s.container_edits.mounts[0].options.push("rw".into()),
            |s| drop(s.annotations.insert("a".into(), "other".into())),
            |s| s.devices[0].container_edits.env.push("B=2".into()),
            |s| s.devices[0].name = "gpu-1".into(),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut other = spec();
            change(&mut other);
            assert!(!held.is(&other), "change {i}");
            assert_ne!(held, HeldSpec::new(&other), "change {i}");
        }
    }

    #[test]
    fn its_env_is_the_specs_container_env_and_not_a_devices() {
        assert_eq!(HeldSpec::new(&spec()).env().unwrap(), spec().container_edits.env);
        let mut bare = spec();
        bare.container_edits = ContainerEdits::default();
        // Only the device's own env is left, which is not every container's.
        assert_eq!(HeldSpec::new(&bare).env().unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_spec_read_back_in_another_layout_is_the_same_spec() {
        // A spec file is read and parsed before it is compared: its spacing and the order of its
        // map keys on disk do not matter, only what the spec says.
        let compact = serde_json::to_string(&spec()).unwrap();
        let text = compact.replace(r#""a":"first","z":"last""#, r#" "z" : "last" , "a" : "first" "#);
        assert_ne!(text, compact);
        let back: Spec = serde_json::from_str(&text).unwrap();
        assert!(HeldSpec::new(&spec()).is(&back));
    }

    #[test]
    fn it_holds_less_than_the_spec() {
        let held = HeldSpec::new(&spec());
        assert!(held.env.get().len() < serde_json::to_string(&spec()).unwrap().len() / 2);
    }
}
