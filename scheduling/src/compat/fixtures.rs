//! Builders shared by the compat tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{CardModel, ClassFacts};

pub const GPU: &str = "nvidia.com/gpu";
pub const MEM: &str = "nvidia.com/gpumem";
pub const PCT: &str = "nvidia.com/gpumem-percentage";
pub const CORES: &str = "nvidia.com/gpucores";
pub const PRIO: &str = "nvidia.com/priority";
pub const T4_BYTES: u64 = 15 << 30;
pub const A100_BYTES: u64 = 80 << 30;

fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, KubeQuantity>> {
    (!pairs.is_empty()).then(|| pairs.iter().map(|(k, v)| ((*k).to_owned(), KubeQuantity((*v).to_owned()))).collect())
}

/// A container with these limits.
pub fn container(name: &str, limits: &[(&str, &str)]) -> Container {
    with_requests(name, limits, &[])
}

/// A container with these limits and requests.
pub fn with_requests(name: &str, limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Container {
    Container {
        name: name.into(),
        image: Some("cuda".into()),
        resources: Some(ResourceRequirements { limits: list(limits), requests: list(requests), ..Default::default() }),
        ..Default::default()
    }
}

/// The container made privileged.
pub fn privileged(mut c: Container) -> Container {
    c.security_context = Some(SecurityContext { privileged: Some(true), ..Default::default() });
    c
}

/// A pod with these containers and annotations.
pub fn pod(name: &str, containers: Vec<Container>, annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: (!annotations.is_empty())
                .then(|| annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        },
        spec: Some(PodSpec { containers, restart_policy: Some("Never".into()), ..Default::default() }),
        ..Default::default()
    }
}

/// Annotations as a map.
pub fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// One node of two T4s, as in source document 003 (with a second card).
pub fn t4_facts() -> ClassFacts {
    ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: T4_BYTES }], 2)
}

/// T4 and A100 nodes, listed in an order that is not sorted.
pub fn mixed_facts() -> ClassFacts {
    ClassFacts::new(
        [
            CardModel { product_name: "NVIDIA A100-SXM4-80GB".into(), memory_bytes: A100_BYTES },
            CardModel { product_name: "Tesla T4".into(), memory_bytes: T4_BYTES },
        ],
        8,
    )
}

/// Applies RFC 6902 `add` and `remove` operations (the only ones the conversion emits).
pub fn apply_patch(doc: &mut Value, ops: &[Value]) {
    for op in ops {
        let path = op["path"].as_str().expect("path");
        let (parent, last) = path.rsplit_once('/').expect("pointer");
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc.pointer_mut(parent).unwrap_or_else(|| panic!("no parent for {path}"));
        match (op["op"].as_str().expect("op"), target) {
            ("add", Value::Array(items)) if last == "-" => items.push(op["value"].clone()),
            ("add", Value::Object(map)) => {
                assert!(!map.contains_key(&last), "add over an existing member {path}");
                map.insert(last, op["value"].clone());
            }
            ("remove", Value::Object(map)) => {
                map.remove(&last).unwrap_or_else(|| panic!("remove of a missing member {path}"));
            }
            (other, _) => panic!("unexpected op {other} at {path}"),
        }
    }
}

/// Reads one CEL double-quoted string literal at the start of `s`: its decoded text and the
/// bytes it spans. Panics on anything that is not a well-formed literal.
pub fn read_cel_literal(s: &str) -> (String, usize) {
    let bytes = s.as_bytes();
    assert_eq!(bytes[0], b'"', "literal must start with a quote: {s}");
    let mut out = String::new();
    let mut i = 1;
    loop {
        match bytes[i] {
            b'"' => return (out, i + 1),
            b'\\' => {
                let (c, len) = match bytes[i + 1] {
                    b'\\' => ('\\', 2),
                    b'"' => ('"', 2),
                    b'u' => (char::from_u32(u32::from_str_radix(&s[i + 2..i + 6], 16).expect("hex")).expect("char"), 6),
                    b'U' => (char::from_u32(u32::from_str_radix(&s[i + 2..i + 10], 16).expect("hex")).expect("char"), 10),
                    other => panic!("escape {} not produced by cel_string", other as char),
                };
                out.push(c);
                i += len;
            }
            b if (0x20..0x7f).contains(&b) => {
                out.push(b as char);
                i += 1;
            }
            b => panic!("raw byte {b:#x} inside a literal"),
        }
    }
}

/// The expression with every string literal replaced by `""`, plus the literals' texts: the
/// shape a hostile value must not change.
pub fn cel_skeleton(expr: &str) -> (String, Vec<String>) {
    let mut shape = String::new();
    let mut literals = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find('"') {
        shape.push_str(&rest[..at]);
        let (text, len) = read_cel_literal(&rest[at..]);
        shape.push_str("\"\"");
        literals.push(text);
        rest = &rest[at + len..];
    }
    shape.push_str(rest);
    (shape, literals)
}
