//! vgpu-dra's own keys that HAMi's form shares (`filterDevices`, `nodeConfig`): refused when
//! unknown in our own form, listed as ignored in HAMi's.

use super::model::{IgnoredKey, UNKNOWN_WHY};
use crate::yaml_tree::{Bad, Node};
use crate::{DeviceFilter, NodeOverride};

/// `filterDevices: {uuid: [...], index: [...]}`.
pub(super) fn filter(node: &Node, key: &str, lenient: bool, ignored: &mut Vec<IgnoredKey>) -> Result<DeviceFilter, Bad> {
    let mut filter = DeviceFilter::default();
    for (k, v) in node.map(key)? {
        let name = k.key_text();
        let path = format!("{key}.{name}");
        match name.as_str() {
            "uuid" => filter.uuids = v.seq(&path)?.iter().map(|u| u.text(&path)).collect::<Result<_, _>>()?,
            "index" => filter.indices = v.int32_list(&path)?,
            _ => unknown(k, path, lenient, "uuid, index", ignored)?,
        }
    }
    Ok(filter)
}

/// One `nodeConfig` entry: `name` (one node or a list) and the settings it replaces there.
pub(super) fn node_override(node: &Node, key: &str, lenient: bool, ignored: &mut Vec<IgnoredKey>) -> Result<NodeOverride, Bad> {
    let mut o = NodeOverride::default();
    for (k, v) in node.map(key)? {
        let name = k.key_text();
        let path = format!("{key}.{name}");
        match name.as_str() {
            "name" => o.nodes = v.text_list(&path)?,
            "deviceSplitCount" => o.device_split_count = Some(v.int32(&path, 1, u32::MAX)?),
            "deviceMemoryScaling" => o.memory_scaling = Some(v.ratio(&path)?),
            "deviceCoreScaling" => o.core_scaling = Some(v.ratio(&path)?),
            "filterDevices" => o.filter = Some(filter(v, &path, lenient, ignored)?),
            _ => unknown(
                k,
                path,
                lenient,
                "name, deviceSplitCount, deviceMemoryScaling, deviceCoreScaling, filterDevices",
                ignored,
            )?,
        }
    }
    if o.nodes.is_empty() {
        return Err(Bad::new(node, &format!("{key}.name"), "every entry needs the node name(s) it applies to"));
    }
    Ok(o)
}

/// An unknown key of ours: listed as ignored in HAMi's form, refused in our own.
fn unknown(k: &Node, path: String, lenient: bool, expected: &str, ignored: &mut Vec<IgnoredKey>) -> Result<(), Bad> {
    if lenient {
        ignored.push(IgnoredKey { key: path, why: UNKNOWN_WHY });
        Ok(())
    } else {
        Err(Bad::new(k, &path, format!("unknown key; expected {expected}")))
    }
}
