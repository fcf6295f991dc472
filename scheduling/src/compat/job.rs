//! Volcano Jobs (`batch.volcano.sh/v1alpha1`): each task's pod template converted as a pod is, so
//! the Volcano controller creates pods that already reference their claim templates and never
//! carry HAMi resources. A task's pods are scheduled by the scheduler Volcano gives them (the
//! template's, the Job's, else Volcano's default): with Volcano's they keep a request
//! ([`super::VolcanoSettings`]).
//!
//! The Job is read as JSON rather than as a typed struct: only `spec.tasks[].name` and
//! `spec.tasks[].template` matter here, and the rest of a Job (policies, plugins, fields of newer
//! Volcano releases) must pass through untouched whatever it holds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::Value;

use super::error::CompatError;
use super::pod::convert_pod_spec;
use super::settings::{ClassFacts, CompatSettings};

/// A converted Volcano Job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobConversion {
    /// Templates the tasks reference, one per distinct request shape across all tasks, sorted by
    /// name.
    pub templates: Vec<ResourceClaimTemplate>,
    /// RFC 6902 operations on the Job (paths under `/spec/tasks/<i>/template/spec`); empty when
    /// no task changes.
    pub patch: Vec<Value>,
    /// Admission warnings, each prefixed with its task.
    pub warnings: Vec<String>,
}

impl JobConversion {
    /// Whether the Job changes.
    pub fn changed(&self) -> bool {
        !self.patch.is_empty()
    }
}

/// Why a Volcano Job is denied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// A task's pod template is denied as a pod would be.
    #[error("task {task:?}: {source}")]
    Task {
        /// The task's name (or `#<index>` when it has none).
        task: String,
        /// Why (boxed: a Job's error travels far, a pod's is already large).
        #[source]
        source: Box<CompatError>,
    },
    /// A task's `template` is not a pod template.
    #[error("task {task:?}: spec.tasks[{index}].template is not a pod template: {reason}")]
    BadTemplate {
        /// The task's name (or `#<index>`).
        task: String,
        /// Its index in `spec.tasks`.
        index: usize,
        /// The decoder's message.
        reason: String,
    },
}

impl JobError {
    /// A short, fixed label for metrics, as [`CompatError::reason`].
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Task { source, .. } => source.reason(),
            Self::BadTemplate { .. } => "bad_template",
        }
    }
}

/// Converts every task of the Volcano Job `job` (its JSON, as the API server sends it); a Job
/// without HAMi resources is left unchanged.
///
/// # Errors
/// [`JobError`] for the first task that is denied; nothing is converted then.
pub fn convert_volcano_job(job: &Value, settings: &CompatSettings, facts: &ClassFacts) -> Result<JobConversion, JobError> {
    let tasks = job.pointer("/spec/tasks").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut templates = BTreeMap::new();
    let mut patch = Vec::new();
    let mut warnings = Vec::new();
    let job_scheduler = job.pointer("/spec/schedulerName").and_then(Value::as_str);
    for (index, task) in tasks.iter().enumerate() {
        let name = task.get("name").and_then(Value::as_str).map_or_else(|| format!("#{index}"), str::to_owned);
        let Some(raw) = task.get("template") else { continue };
        let template: PodTemplateSpec = serde_json::from_value(raw.clone()).map_err(|e| JobError::BadTemplate {
            task: name.clone(),
            index,
            reason: e.to_string(),
        })?;
        let Some(spec) = template.spec else { continue };
        // Volcano copies the template's metadata onto each pod: its annotations are the pod's.
        let annotations = template.metadata.and_then(|m| m.annotations).unwrap_or_default();
        let path = format!("/spec/tasks/{index}/template/spec");
        let scheduler = settings.volcano.job_pod_scheduler(spec.scheduler_name.as_deref(), job_scheduler);
        let converted = convert_pod_spec(&annotations, &spec, Some(scheduler), &path, settings, facts)
            .map_err(|source| JobError::Task { task: name.clone(), source: Box::new(source) })?;
        patch.extend(converted.patch);
        warnings.extend(converted.warnings.into_iter().map(|w| format!("task {name:?}: {w}")));
        for t in converted.templates {
            templates.entry(t.metadata.name.clone().unwrap_or_default()).or_insert(t);
        }
    }
    Ok(JobConversion { templates: templates.into_values().collect(), patch, warnings })
}

#[cfg(test)]
#[path = "job_tests.rs"]
mod tests;
