//! Serde types of a CDI spec file (the subset of CDI 1.1 this driver emits and reads back).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{CdiVersion, DeviceName, Kind, NameError};

/// One CDI spec file: a kind and the devices it defines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The CDI spec version the file claims; [`Spec::new`] sets the lowest that fits.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec-level annotations (need cdiVersion 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices of this spec.
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of this spec is injected.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

impl Spec {
    /// A spec of `kind` holding `devices`, with `cdiVersion` set to the lowest version that can
    /// express it (runtimes reject a spec whose version is too low for what it holds).
    ///
    /// # Errors
    /// [`NameError`] when a device name breaks CDI's rules.
    pub fn new(kind: &Kind, devices: Vec<Device>) -> Result<Self, NameError> {
        for d in &devices {
            DeviceName::new(d.name.clone())?;
        }
        let mut spec = Self {
            cdi_version: String::new(),
            kind: kind.to_string(),
            annotations: BTreeMap::new(),
            devices,
            container_edits: ContainerEdits::default(),
        };
        spec.cdi_version = CdiVersion::minimum_for(&spec).to_string();
        Ok(spec)
    }

    /// Recomputes `cdiVersion` after the spec was changed by hand.
    pub fn set_minimum_version(&mut self) {
        self.cdi_version = CdiVersion::minimum_for(self).to_string();
    }
}

/// A device of a spec: a name and the edits that inject it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The device name, unique in the spec.
    pub name: String,
    /// Device annotations (need cdiVersion 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What injecting the device does to a container.
    pub container_edits: ContainerEdits,
}

/// Changes to an OCI container spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `NAME=value` environment entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Supplementary group IDs (need cdiVersion 0.7.0).
    #[serde(default, rename = "additionalGids", skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// Whether the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
    }
}

/// A device node in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host when it differs (needs cdiVersion 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`; with `major` set the runtime need not stat the host node.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Device major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Device minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Cgroup permissions, such as `rw` or `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// File mode bits of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Owner in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A bind mount into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options such as `ro`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type (needs cdiVersion 0.4.0).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// OCI hook point, such as `createContainer`.
    pub hook_name: String,
    /// Executable on the host.
    pub path: String,
    /// Arguments, `argv[0]` included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the hook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

// Here rather than beside the versions: what a spec needs is read from the spec's fields, and
// the versions know nothing of specs.
impl CdiVersion {
    /// The lowest version that can express `spec`.
    pub fn minimum_for(spec: &Spec) -> Self {
        let all_edits = || spec.devices.iter().map(|d| &d.container_edits).chain([&spec.container_edits]);
        let needs = |f: fn(&ContainerEdits) -> bool| all_edits().any(f);
        let class_has_dot = spec.kind.split_once('/').is_some_and(|(_, c)| c.contains('.'));
        if needs(|e| !e.additional_gids.is_empty()) {
            Self::V0_7_0
        } else if !spec.annotations.is_empty() || spec.devices.iter().any(|d| !d.annotations.is_empty()) || class_has_dot {
            Self::V0_6_0
        } else if spec.devices.iter().any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
            || needs(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()))
        {
            Self::V0_5_0
        } else if needs(|e| e.mounts.iter().any(|m| m.kind.is_some())) {
            Self::V0_4_0
        } else {
            Self::V0_3_0
        }
    }
}
