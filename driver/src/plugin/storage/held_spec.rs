//! A prepared claim's CDI spec as the driver holds it between prepare and unprepare: its JSON
//! text in one allocation. Parsed, a spec is some sixty small allocations (every env entry,
//! mount option and annotation its own string), 2.4 KiB per claim and scattered through the
//! heap, where they kept whole pages of a burst's freed memory resident (BENCHMARKS.md, issue
//! 35); the text is about 1.2 KiB. It is read back only off the hot path: a restore after a
//! lost spec file, the claim's status once per prepare, the monitor once per claim.
//!
//! In a record it is the same JSON as the parsed spec's, so records and their checksums are
//! unchanged, and a record read from disk is parsed in full, as before, before it is held.

use cdi_spec::Spec;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// A claim's CDI spec, held as its compact JSON.
#[derive(Clone)]
pub struct HeldSpec(Box<RawValue>);

/// The held text is not a spec: only a bug can cause it, since only a parsed spec is held.
#[derive(Debug, thiserror::Error)]
#[error("the CDI spec held for the claim does not read back")]
pub struct HeldSpecError(#[from] serde_json::Error);

impl HeldSpec {
    /// Holds `spec`.
    pub fn new(spec: &Spec) -> Self {
        // A spec is strings, numbers, sequences and string-keyed maps: its JSON cannot fail.
        Self(serde_json::value::to_raw_value(spec).expect("a CDI spec always has a JSON form"))
    }

    /// The spec, parsed.
    ///
    /// # Errors
    /// [`HeldSpecError`] if the text does not read back as a spec.
    pub fn parse(&self) -> Result<Spec, HeldSpecError> {
        Ok(serde_json::from_str(self.0.get())?)
    }

    /// The environment the spec gives every container (its `containerEdits.env`), read without
    /// building the rest.
    ///
    /// # Errors
    /// [`HeldSpecError`] if the text does not read back.
    pub fn env(&self) -> Result<Vec<String>, HeldSpecError> {
        #[derive(Deserialize)]
        struct Edits {
            #[serde(default)]
            env: Vec<String>,
        }
        #[derive(Deserialize)]
        struct EnvOnly {
            #[serde(rename = "containerEdits", default)]
            container_edits: Option<Edits>,
        }
        let only: EnvOnly = serde_json::from_str(self.0.get())?;
        Ok(only.container_edits.map(|e| e.env).unwrap_or_default())
    }

    /// The spec's JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// Whether this is the same spec as `spec`: the same JSON, as a spec's JSON has one form
    /// (fields in declaration order, maps sorted).
    pub fn is(&self, spec: &Spec) -> bool {
        serde_json::to_string(spec).is_ok_and(|text| text == self.json())
    }
}

impl PartialEq for HeldSpec {
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
    }
}

impl Eq for HeldSpec {}

impl std::fmt::Debug for HeldSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.json())
    }
}

impl Serialize for HeldSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for HeldSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Parsed in full, so a record with a spec that is not one is refused as before.
        Spec::deserialize(deserializer).map(|spec| Self::new(&spec))
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
    fn a_held_spec_reads_back_as_the_spec() {
        let held = HeldSpec::new(&spec());
        assert_eq!(held.parse().unwrap(), spec());
        assert!(held.is(&spec()));
        let mut other = spec();
        other.container_edits.env.pop();
        assert!(!held.is(&other));
        assert_ne!(held, HeldSpec::new(&other));
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
    fn in_a_record_it_is_the_parsed_spec_json() {
        // Records written before specs were held as text must keep their checksums.
        #[derive(Serialize)]
        struct Parsed {
            spec: Spec,
        }
        #[derive(Serialize, Deserialize)]
        struct Held {
            spec: HeldSpec,
        }
        let parsed = serde_json::to_string(&Parsed { spec: spec() }).unwrap();
        let held = serde_json::to_string(&Held { spec: HeldSpec::new(&spec()) }).unwrap();
        assert_eq!(held, parsed);
        let back: Held = serde_json::from_str(&parsed).unwrap();
        assert_eq!(back.spec.parse().unwrap(), spec());
    }

    #[test]
    fn text_that_is_not_a_spec_is_refused_when_read() {
        #[derive(Deserialize, Debug)]
        struct Held {
            #[allow(dead_code)]
            spec: HeldSpec,
        }
        for bad in [r#"{"spec":{"cdiVersion":7}}"#, r#"{"spec":[]}"#, r#"{"spec":"text"}"#] {
            assert!(serde_json::from_str::<Held>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spacing_and_order_in_a_record_do_not_change_what_is_held() {
        let compact = serde_json::to_string(&spec()).unwrap();
        let pretty = serde_json::to_string_pretty(&spec()).unwrap();
        let a: HeldSpec = serde_json::from_str(&compact).unwrap();
        let b: HeldSpec = serde_json::from_str(&pretty).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.json(), compact);
    }
}
