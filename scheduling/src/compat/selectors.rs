//! HAMi's card selection annotations as CEL device selectors, with every annotation value
//! escaped into a CEL string literal so that no value can change the expression's shape.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Card models a pod may use: comma-separated, case-insensitive substrings of the model.
pub const ANNOTATION_USE_TYPE: &str = "nvidia.com/use-gputype";
/// Card models a pod must not use: comma-separated, case-insensitive substrings of the model.
pub const ANNOTATION_NOUSE_TYPE: &str = "nvidia.com/nouse-gputype";
/// Cards a pod may use: comma-separated exact UUIDs.
pub const ANNOTATION_USE_UUID: &str = "nvidia.com/use-gpuuuid";
/// Cards a pod must not use: comma-separated exact UUIDs.
pub const ANNOTATION_NOUSE_UUID: &str = "nvidia.com/nouse-gpuuuid";

/// HAMi annotations with no DRA meaning, each with why; they are accepted with a warning.
pub const IGNORED_ANNOTATIONS: &[(&str, &str)] = &[
    ("hami.io/gpu-scheduler-policy", "kube-scheduler picks the card; HAMi's binpack/spread card policy does not apply"),
    ("hami.io/node-scheduler-policy", "kube-scheduler scores the nodes; HAMi's binpack/spread node policy does not apply"),
    ("nvidia.com/numa-bind", "NUMA binding of cards is not expressed in the claim; this annotation does not apply"),
];

/// HAMi names a card type `NVIDIA-<model>`, and its substring match runs over that whole name
/// (so `NVIDIA-Tesla` works); the selector prefixes the `productName` attribute the same way.
const TYPE_PREFIX: &str = "nvidia-";

/// The selection a pod's annotations ask for. Lists are trimmed, empty entries dropped; types
/// are lower-cased because HAMi matches them case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Allowed model substrings (lower case); empty = any.
    pub use_types: Vec<String>,
    /// Forbidden model substrings (lower case).
    pub nouse_types: Vec<String>,
    /// Allowed card UUIDs; empty = any.
    pub use_uuids: Vec<String>,
    /// Forbidden card UUIDs.
    pub nouse_uuids: Vec<String>,
}

impl Selection {
    /// Reads the four annotations; an empty value (or one of only commas and spaces) is no
    /// constraint, as in HAMi.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        let list = |key: &str, lower: bool| -> Vec<String> {
            let Some(value) = annotations.get(key) else { return Vec::new() };
            let mut items: Vec<String> = value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| if lower { s.to_ascii_lowercase() } else { s.to_owned() })
                .collect();
            items.dedup();
            items
        };
        Self {
            use_types: list(ANNOTATION_USE_TYPE, true),
            nouse_types: list(ANNOTATION_NOUSE_TYPE, true),
            use_uuids: list(ANNOTATION_USE_UUID, false),
            nouse_uuids: list(ANNOTATION_NOUSE_UUID, false),
        }
    }

    /// Whether a card of `product_name` passes the type annotations: the same rule as the CEL
    /// selectors, used to leave unselectable models out of a percentage's prioritized list.
    pub fn allows_model(&self, product_name: &str) -> bool {
        let name = format!("{TYPE_PREFIX}{}", product_name.to_ascii_lowercase());
        (self.use_types.is_empty() || self.use_types.iter().any(|t| name.contains(t.as_str())))
            && !self.nouse_types.iter().any(|t| name.contains(t.as_str()))
    }

    /// The CEL selectors on `driver`'s device attributes, one per annotation given.
    pub fn selectors(&self, driver: &str) -> Vec<String> {
        self.selectors_on(driver, "uuid")
    }

    /// [`Self::selectors`] with the card's UUID read from attribute `uuid_attribute`: a MIG
    /// device carries its card's in `parentUUID`, and the UUID annotations name cards.
    pub fn selectors_on(&self, driver: &str, uuid_attribute: &str) -> Vec<String> {
        let attr = |name: &str| format!("device.attributes[{}].{name}", cel_string(driver));
        let product = attr("productName");
        let uuid = attr(uuid_attribute);
        let type_match = |types: &[String]| {
            format!(
                "has({product}) && {}.exists(t, ({} + {product}).lowerAscii().contains(t))",
                cel_list(types),
                cel_string(TYPE_PREFIX)
            )
        };
        let uuid_match = |uuids: &[String]| format!("has({uuid}) && {uuid} in {}", cel_list(uuids));
        let mut out = Vec::new();
        if !self.use_types.is_empty() {
            out.push(type_match(&self.use_types));
        }
        if !self.nouse_types.is_empty() {
            out.push(format!("!({})", type_match(&self.nouse_types)));
        }
        if !self.use_uuids.is_empty() {
            out.push(uuid_match(&self.use_uuids));
        }
        if !self.nouse_uuids.is_empty() {
            out.push(format!("!({})", uuid_match(&self.nouse_uuids)));
        }
        out
    }
}

/// One warning per annotation that HAMi honours but DRA cannot (kubectl prints them).
pub fn annotation_warnings(annotations: &BTreeMap<String, String>) -> Vec<String> {
    IGNORED_ANNOTATIONS
        .iter()
        .filter(|(key, _)| annotations.contains_key(*key))
        .map(|(key, why)| format!("annotation {key} is ignored: {why}"))
        .collect()
}

/// `s` as a double-quoted CEL string literal. Backslash and quote are escaped, and everything
/// outside printable ASCII becomes a `\u`/`\U` escape, so the literal is one token whatever `s`
/// holds (quotes, newlines, bidi controls).
pub fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

/// A CEL list of string literals.
pub(super) fn cel_list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| cel_string(s)).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
#[path = "selectors_tests.rs"]
mod tests;
