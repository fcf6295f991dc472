//! Volcano's view of a converted pod: the pods of Volcano's scheduler keep a request.
//!
//! vc-scheduler sizes a task by its containers' `resources.requests` (cpu, memory and every
//! other resource but `pods` and `count/*`; init containers as the kubelet counts them; the
//! pod-level `resources` and `overhead`), never by its ResourceClaims. A task that requests
//! none of it is best-effort (`TaskInfo.BestEffort`, from `Resreq.IsEmpty()` in Volcano's
//! `NewTaskInfo`): the `allocate` action skips it and `backfill` binds it on its own, so its gang
//! is not held whole (a best-effort task counts as ready) and its queue's `capability` is never
//! checked. Under HAMi a GPU pod kept its `volcano.sh/vgpu-*` (or `nvidia.com/gpu*`) resources,
//! which Volcano counts, so it was never best-effort; once the conversion has moved them into a
//! claim, a pod that asked for nothing else would be. So a converted pod of Volcano's scheduler
//! that requests nothing gets a minimal cpu request ([`VolcanoSettings::cpu_request`], `1m`) on
//! one converted container: too small to change where it fits, enough for Volcano to schedule it
//! as HAMi's pod was scheduled.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use serde_json::{Value, json};

use crate::Quantity;

/// Volcano's scheduler name: the default of vc-scheduler's and vc-webhook-manager's
/// `--scheduler-name`.
pub const VOLCANO_SCHEDULER: &str = "volcano";

/// The cpu request added by default: Kubernetes' smallest cpu step.
pub const DEFAULT_CPU_REQUEST: &str = "1m";

/// How pods of Volcano's scheduler are kept from being best-effort tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolcanoSettings {
    /// The scheduler names Volcano serves (vc-scheduler's `--scheduler-name`); a Volcano Job that
    /// names none gets the first, as Volcano's Job webhook gives it.
    pub scheduler_names: Vec<String>,
    /// The cpu request a converted pod of those schedulers gets when it requests nothing else;
    /// `None` adds nothing.
    pub cpu_request: Option<Quantity>,
}

impl Default for VolcanoSettings {
    fn default() -> Self {
        Self { scheduler_names: vec![VOLCANO_SCHEDULER.to_owned()], cpu_request: Quantity::parse(DEFAULT_CPU_REQUEST).ok() }
    }
}

impl VolcanoSettings {
    /// Whether pods naming `scheduler` are scheduled by Volcano.
    pub fn is_volcano(&self, scheduler: Option<&str>) -> bool {
        scheduler.is_some_and(|s| self.scheduler_names.iter().any(|n| n == s))
    }

    /// The scheduler name the pods of a Volcano Job's task get, as Volcano's job controller
    /// makes them: the task template's, else the Job's, else the one Volcano's Job webhook
    /// writes into a Job that names none (the first of [`Self::scheduler_names`]).
    pub fn job_pod_scheduler<'a>(&'a self, template: Option<&'a str>, job: Option<&'a str>) -> &'a str {
        template
            .filter(|s| !s.is_empty())
            .or(job.filter(|s| !s.is_empty()))
            .or(self.scheduler_names.first().map(String::as_str))
            .unwrap_or(VOLCANO_SCHEDULER)
    }
}

/// Whether pods of `spec` request anything Volcano counts: a non-zero request or limit (the API
/// server makes a limit the request when none is given, and a Job's pod template is not
/// defaulted until its pods are made) of any resource but `pods` and `count/*`, in any
/// container or init container, in the pod-level `resources`, or in `overhead`. A value that
/// is not a quantity counts: the API server refuses the pod anyway.
pub fn requests_something(spec: &PodSpec) -> bool {
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    let container_lists = containers
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| [r.requests.as_ref(), r.limits.as_ref()].into_iter().flatten());
    let pod_lists =
        spec.resources.as_ref().into_iter().flat_map(|r| [r.requests.as_ref(), r.limits.as_ref()].into_iter().flatten());
    container_lists.chain(pod_lists).chain(spec.overhead.as_ref()).any(|list| list.iter().any(|(name, q)| counts(name, q)))
}

/// Whether Volcano counts `name: quantity` in a task's request.
fn counts(name: &str, quantity: &KubeQuantity) -> bool {
    if name == "pods" || name.starts_with("count/") {
        return false;
    }
    Quantity::parse(&quantity.0).map_or(true, |q| !q.is_zero())
}

/// What [`keep_requesting`] did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kept {
    /// Nothing to do: not Volcano's pod, nothing converted, the pod requests something, or the
    /// request is turned off.
    Untouched,
    /// The request was added to the spec; the patch operation that adds it.
    Added(Value),
    /// Every claimed container already names cpu (as zero): the warning to give.
    NoRoom(String),
}

/// Adds [`VolcanoSettings::cpu_request`] to the first container of `claimed` (indices into
/// `spec.containers`, then into `spec.init_containers`: a regular container lasts as long as
/// the pod) that names no cpu, when pods of `spec` go to `scheduler`, one of Volcano's, and
/// request nothing else. `spec` is the converted spec; `path` is its JSON pointer.
pub(crate) fn keep_requesting(
    spec: &mut PodSpec,
    claimed: &Claimed,
    scheduler: Option<&str>,
    settings: &VolcanoSettings,
    path: &str,
) -> Kept {
    let Some(cpu) = settings.cpu_request.filter(|q| !q.is_zero()) else { return Kept::Untouched };
    if claimed.is_empty() || !settings.is_volcano(scheduler) || requests_something(spec) {
        return Kept::Untouched;
    }
    let candidates =
        claimed.containers.iter().map(|&i| ("containers", i)).chain(claimed.init.iter().map(|&i| ("initContainers", i)));
    for (field, index) in candidates {
        let list = if field == "containers" { Some(&mut spec.containers) } else { spec.init_containers.as_mut() };
        let Some(container) = list.and_then(|l| l.get_mut(index)) else { continue };
        if names_cpu(container) {
            continue;
        }
        let value = KubeQuantity(cpu.to_string());
        let resources = container.resources.get_or_insert_with(Default::default);
        let at = format!("{path}/{field}/{index}/resources/requests");
        let op = match resources.requests.as_mut() {
            Some(requests) => {
                requests.insert("cpu".to_owned(), value.clone());
                json!({"op": "add", "path": format!("{at}/cpu"), "value": value})
            }
            None => {
                resources.requests = Some([("cpu".to_owned(), value.clone())].into_iter().collect());
                json!({"op": "add", "path": at, "value": {"cpu": value}})
            }
        };
        return Kept::Added(op);
    }
    Kept::NoRoom(format!(
        "the pod requests no CPU, memory or other resource besides its GPU claims, so Volcano would schedule it as a best-effort task (its gang not held whole, its queue's capability not checked); its GPU containers all name a zero cpu, so vgpu-dra cannot add the {cpu} it adds otherwise: request some cpu"
    ))
}

/// Whether `container` has cpu among its requests or limits (a zero one included: a request
/// added beside a zero limit would be refused).
fn names_cpu(container: &Container) -> bool {
    container
        .resources
        .as_ref()
        .is_some_and(|r| [r.requests.as_ref(), r.limits.as_ref()].into_iter().flatten().any(|m| m.contains_key("cpu")))
}

/// The containers a conversion gave a claim, by index, in the order visited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// Indices into `spec.containers`.
    pub containers: Vec<usize>,
    /// Indices into `spec.init_containers`.
    pub init: Vec<usize>,
}

impl Claimed {
    /// Whether no container was given a claim.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.init.is_empty()
    }
}

#[cfg(test)]
#[path = "volcano_tests.rs"]
mod tests;
