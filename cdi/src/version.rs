//! The lowest `cdiVersion` that can express a spec. Runtimes refuse specs that claim a version too
//! low for the features they use, and older runtimes refuse versions they do not know, so the
//! driver always emits the lowest version that fits.

use std::fmt;

/// CDI spec versions this crate knows, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CdiVersion {
    /// 0.3.0, the oldest version current runtimes accept.
    V0_3_0,
    /// 0.4.0: mount `type`.
    V0_4_0,
    /// 0.5.0: device names starting with a digit, device node `hostPath`.
    V0_5_0,
    /// 0.6.0: annotations, `.` in the class.
    V0_6_0,
    /// 0.7.0: `additionalGids`, `intelRdt`.
    V0_7_0,
    /// 1.1.0: `netDevices`, newer `intelRdt` fields (not emitted by this crate).
    V1_1_0,
}

impl CdiVersion {
    /// The newest version this crate knows.
    pub const LATEST: Self = Self::V1_1_0;

    /// The version string as written in `cdiVersion`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_4_0 => "0.4.0",
            Self::V0_5_0 => "0.5.0",
            Self::V0_6_0 => "0.6.0",
            Self::V0_7_0 => "0.7.0",
            Self::V1_1_0 => "1.1.0",
        }
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use crate::{ContainerEdits, Device, DeviceNode, Kind, Mount, Spec};

    fn device(name: &str, edits: ContainerEdits) -> Device {
        Device { name: name.into(), annotations: Default::default(), container_edits: edits }
    }

    fn env_only() -> ContainerEdits {
        ContainerEdits { env: vec!["A=1".into()], ..Default::default() }
    }

    #[test]
    fn plain_spec_is_0_3_0() {
        let spec = Spec::new(&Kind::parse("v.io/claim").unwrap(), vec![device("gpu", env_only())]).unwrap();
        assert_eq!(spec.cdi_version, "0.3.0");
    }

    #[test]
    fn each_feature_raises_the_version_to_exactly_its_own() {
        let kind = Kind::parse("v.io/claim").unwrap();
        let typed_mount = ContainerEdits {
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/a".into(),
                options: vec![],
                kind: Some("bind".into()),
            }],
            ..Default::default()
        };
        assert_eq!(Spec::new(&kind, vec![device("gpu", typed_mount)]).unwrap().cdi_version, "0.4.0");
        // Claim UIDs can start with a digit: that alone needs 0.5.0.
        assert_eq!(Spec::new(&kind, vec![device("6f1c-gpu", env_only())]).unwrap().cdi_version, "0.5.0");
        let host_path = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: Some("/dev/x".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(Spec::new(&kind, vec![device("gpu", host_path)]).unwrap().cdi_version, "0.5.0");
        let dotted = Kind::parse("v.io/cl.aim").unwrap();
        assert_eq!(Spec::new(&dotted, vec![device("gpu", env_only())]).unwrap().cdi_version, "0.6.0");
        let mut annotated = Spec::new(&kind, vec![device("gpu", env_only())]).unwrap();
        annotated.annotations.insert("a".into(), "b".into());
        annotated.set_minimum_version();
        assert_eq!(annotated.cdi_version, "0.6.0");
        let gids = ContainerEdits { additional_gids: vec![44], ..Default::default() };
        assert_eq!(Spec::new(&kind, vec![device("0gpu", gids)]).unwrap().cdi_version, "0.7.0");
    }
}
