//! `convert`: manifests written for HAMi or Volcano's vGPU device plugin, converted as the
//! webhook converts them, so they can be reviewed, committed and applied without it.
//!
//! Every pod or pod template goes through the webhook's own code: the name set is picked with
//! [`compat::pick`], a pod (or a template read as a pod) converted with [`compat::convert_pod`],
//! a Volcano Job with [`compat::convert_volcano_job`]; the JSON patch they return is applied to
//! the object as written, as the API server applies the webhook's, so everything else stays as
//! it was. The ResourceClaimTemplates they name follow the objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use vgpu_scheduling::compat::{self, ClassFacts, CompatSettings};

/// Where a kind keeps the pod it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// The object is the pod.
    Pod,
    /// A pod template at this JSON pointer (`metadata` and `spec`).
    Template(&'static str),
    /// A Volcano Job: templates under each task.
    VolcanoJob,
}

/// The shape of `object`, from its `apiVersion` and `kind`; `None` for kinds without pods.
fn shape(object: &Value) -> Option<Shape> {
    let field = |k: &str| object.get(k).and_then(Value::as_str).unwrap_or_default();
    let group = field("apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    match (group, field("kind")) {
        ("", "Pod") => Some(Shape::Pod),
        ("", "ReplicationController")
        | ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("batch", "Job") => Some(Shape::Template("/spec/template")),
        ("batch", "CronJob") => Some(Shape::Template("/spec/jobTemplate/spec/template")),
        ("batch.volcano.sh", "Job") => Some(Shape::VolcanoJob),
        _ => None,
    }
}

/// What becomes of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// No GPU resource of HAMi's or Volcano's, or a kind without pods: as written.
    Unchanged,
    /// Converted.
    Converted {
        /// The object after conversion.
        object: Value,
        /// The ResourceClaimTemplates it names, without a namespace of their own (they go where
        /// the object goes).
        templates: Vec<Value>,
        /// The webhook's admission warnings.
        warnings: Vec<String>,
    },
    /// The webhook would deny it; its message.
    Refused(String),
}

/// Converts `object` with the name set it uses out of `flavours`, against `facts`.
pub fn convert_object(object: &Value, flavours: &[CompatSettings], facts: &ClassFacts) -> Outcome {
    let Some(shape) = shape(object) else { return Outcome::Unchanged };
    let mut readable = object.clone();
    quantities_as_strings(&mut readable);
    let converted = match shape {
        Shape::Pod => convert_as_pod(&readable, flavours, facts),
        Shape::Template(at) => match readable.pointer(at) {
            Some(template) => {
                let mut pod = template.clone();
                if let Some(ns) = object.pointer("/metadata/namespace") {
                    pod["metadata"]["namespace"] = ns.clone();
                }
                convert_as_pod(&pod, flavours, facts).map(|c| c.map(|(patch, t, w)| (prefixed(patch, at), t, w)))
            }
            None => Ok(None),
        },
        Shape::VolcanoJob => convert_job(&readable, flavours, facts),
    };
    match converted {
        Ok(None) => Outcome::Unchanged,
        Ok(Some((patch, templates, warnings))) => {
            let mut out = object.clone();
            match apply(&mut out, patch) {
                Ok(()) => Outcome::Converted { object: out, templates, warnings },
                Err(e) => Outcome::Refused(format!("vgpu-dra convert: the conversion does not apply to the object: {e}")),
            }
        }
        Err(message) => Outcome::Refused(message),
    }
}

/// A patch, its templates and warnings; `None` when nothing changes; the denial otherwise.
type Converted = Result<Option<(Vec<Value>, Vec<Value>, Vec<String>)>, String>;

fn convert_as_pod(pod: &Value, flavours: &[CompatSettings], facts: &ClassFacts) -> Converted {
    let pod: Pod = serde_json::from_value(pod.clone()).map_err(|e| format!("vgpu-dra convert: not a pod template: {e}"))?;
    let Some(settings) = compat::pick(flavours, "pod", &compat::pod_resource_names(&pod))? else { return Ok(None) };
    let c = compat::convert_pod(&pod, settings, facts).map_err(|e| e.to_string())?;
    Ok(c.changed().then(|| (c.patch, templates(&c.templates), c.warnings)))
}

fn convert_job(job: &Value, flavours: &[CompatSettings], facts: &ClassFacts) -> Converted {
    let Some(settings) = compat::pick(flavours, "Volcano Job", &compat::job_resource_names(job))? else { return Ok(None) };
    let c = compat::convert_volcano_job(job, settings, facts).map_err(|e| e.to_string())?;
    Ok((!c.patch.is_empty()).then(|| (c.patch, templates(&c.templates), c.warnings)))
}

fn templates<T: serde::Serialize>(templates: &[T]) -> Vec<Value> {
    templates
        .iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .map(|mut t| {
            t["apiVersion"] = "resource.k8s.io/v1".into();
            t["kind"] = "ResourceClaimTemplate".into();
            t
        })
        .collect()
}

/// The operations of a pod's patch (`/spec/...`) moved under the template at `at`.
fn prefixed(patch: Vec<Value>, at: &str) -> Vec<Value> {
    patch
        .into_iter()
        .map(|mut op| {
            if let Some(path) = op.get("path").and_then(Value::as_str) {
                op["path"] = format!("{at}{path}").into();
            }
            op
        })
        .collect()
}

fn apply(object: &mut Value, patch: Vec<Value>) -> Result<(), String> {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(patch)).map_err(|e| e.to_string())?;
    json_patch::patch(object, &patch).map_err(|e| e.to_string())
}

/// Numbers in `limits`, `requests` and `capacity` maps as the strings the API server keeps:
/// YAML reads `nvidia.com/gpu: 1` as a number, a Kubernetes quantity is a string.
fn quantities_as_strings(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if matches!(key.as_str(), "limits" | "requests")
                    && let Value::Object(quantities) = v
                {
                    for q in quantities.values_mut() {
                        if let Value::Number(n) = q {
                            *q = Value::String(n.to_string());
                        }
                    }
                }
                quantities_as_strings(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

/// The documents of a manifest (YAML, several documents, or JSON), with the items of every
/// `List` taken out and empty documents left out.
///
/// # Errors
/// The parser's message when the text is not YAML.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for doc in docs {
        flatten(doc, &mut out);
    }
    Ok(out)
}

fn flatten(doc: Value, out: &mut Vec<Value>) {
    match doc {
        Value::Null => {}
        Value::Object(ref map) if map.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) => {
            if let Some(Value::Array(items)) = map.get("items") {
                for item in items.clone() {
                    flatten(item, out);
                }
            }
        }
        other => out.push(other),
    }
}

/// `Kind/name` (with the namespace when there is one), for messages.
pub fn label(object: &Value) -> String {
    let field = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let kind = if field("/kind").is_empty() { "object" } else { field("/kind") };
    let name = if field("/metadata/name").is_empty() { field("/metadata/generateName") } else { field("/metadata/name") };
    match field("/metadata/namespace") {
        "" => format!("{kind}/{name}"),
        ns => format!("{kind}/{name} in {ns}"),
    }
}

/// Every converted document, then each template named once per namespace; refusals and
/// warnings by object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preview {
    /// The documents, converted where there was something to convert.
    pub documents: Vec<Value>,
    /// The templates the documents name, each once per namespace, sorted.
    pub templates: Vec<Value>,
    /// `(object, warning)`.
    pub warnings: Vec<(String, String)>,
    /// `(object, denial)`.
    pub refusals: Vec<(String, String)>,
}

/// Converts every document.
pub fn preview(documents: Vec<Value>, flavours: &[CompatSettings], facts: &ClassFacts) -> Preview {
    let mut preview = Preview::default();
    let mut templates: BTreeMap<(String, String), Value> = BTreeMap::new();
    for doc in documents {
        let who = label(&doc);
        match convert_object(&doc, flavours, facts) {
            Outcome::Unchanged => preview.documents.push(doc),
            Outcome::Refused(message) => {
                preview.refusals.push((who, message));
                preview.documents.push(doc);
            }
            Outcome::Converted { object, templates: made, warnings } => {
                let namespace = object.pointer("/metadata/namespace").cloned();
                for mut t in made {
                    if let Some(ns) = &namespace {
                        t["metadata"]["namespace"] = ns.clone();
                    }
                    let name = t.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let ns = namespace.as_ref().and_then(Value::as_str).unwrap_or_default().to_owned();
                    templates.entry((ns, name)).or_insert(t);
                }
                preview.warnings.extend(warnings.into_iter().map(|w| (who.clone(), w)));
                preview.documents.push(object);
            }
        }
    }
    preview.templates = templates.into_values().collect();
    preview
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
