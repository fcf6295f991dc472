//! What the commands read from the API server, with the user's kubeconfig: one (paged) list of
//! ResourceSlices and of ResourceClaims, the DeviceClasses, one pod; never a call per node.
//! Every call has a deadline.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Objects per page of a list: a 1,000-node cluster's slices come in a few calls.
const PAGE: u32 = 500;
/// The node drivers' metrics port unless their pod names one (the chart's `metrics.port`).
const DRIVER_METRICS_PORT: i32 = 9394;

/// Where and how to reach the cluster (kubectl's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Kubeconfig file [default: the files in $KUBECONFIG, merged as kubectl merges them, then
    /// ~/.kube/config, then the pod's service account]. $KUBECONFIG is not this flag's twin
    /// because it may name several files.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: its current context].
    #[arg(long, env = "VGPU_DRA_CONTEXT", global = true)]
    pub context: Option<String>,
    /// The DRA driver whose devices are cards.
    #[arg(long, env = "VGPU_DRA_DRIVER_NAME", default_value = "hami-core-gpu.project-hami.io", global = true)]
    pub driver_name: String,
    /// Deadline of each API call, in seconds.
    #[arg(long, env = "VGPU_DRA_REQUEST_TIMEOUT", default_value_t = 30, global = true)]
    pub request_timeout: u64,
}

/// A failed step of talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The kubeconfig cannot be read or names no usable context.
    #[error("reading the kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// No configuration could be inferred.
    #[error("no cluster configuration found")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client cannot be built from the configuration.
    #[error("building the API client")]
    Client(#[source] kube::Error),
    /// A call failed.
    #[error("{what}")]
    Call {
        /// What was asked.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// A call took longer than its deadline.
    #[error("{what}: no answer within {seconds} s")]
    Timeout {
        /// What was asked.
        what: String,
        /// The deadline.
        seconds: u64,
    },
    /// The pod does not exist.
    #[error("pod {namespace}/{name} not found")]
    PodNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl ApiError {
    /// Whether the API refused the call for lack of permission.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Self::Call { source: kube::Error::Api(s), .. } if s.code == 403)
    }
}

/// A connected client with the context's default namespace.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    /// The namespace of the kubeconfig context (`default` when it names none).
    pub default_namespace: String,
    timeout: Duration,
}

impl Cluster {
    /// Connects as `args` say; nothing is called yet.
    ///
    /// # Errors
    /// [`ApiError`] for an unusable kubeconfig.
    pub async fn connect(args: &ClusterArgs) -> Result<Self, ApiError> {
        let options = KubeConfigOptions { context: args.context.clone(), ..Default::default() };
        let mut config = match &args.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(ApiError::Kubeconfig)?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(ApiError::Kubeconfig)?
            }
            None if args.context.is_some() => Config::from_kubeconfig(&options).await.map_err(ApiError::Kubeconfig)?,
            None => Config::infer().await.map_err(ApiError::Infer)?,
        };
        let timeout = Duration::from_secs(args.request_timeout.max(1));
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let default_namespace = config.default_namespace.clone();
        let client = Client::try_from(config).map_err(ApiError::Client)?;
        Ok(Self { client, default_namespace, timeout })
    }

    async fn deadline<T>(&self, what: &str, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ApiError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|source| ApiError::Call { what: what.to_owned(), source }),
            Err(_) => Err(ApiError::Timeout { what: what.to_owned(), seconds: self.timeout.as_secs() }),
        }
    }

    /// Every object of `api`, page by page.
    async fn list<K>(&self, api: Api<K>, what: &str) -> Result<Vec<K>, ApiError>
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let mut items = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = self.deadline(what, api.list(&params)).await?;
            items.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(items),
            }
        }
    }

    /// All ResourceSlices.
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn slices(&self) -> Result<Vec<ResourceSlice>, ApiError> {
        self.list(Api::all(self.client.clone()), "listing ResourceSlices").await
    }

    /// ResourceClaims of all namespaces, or of `namespace`.
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn claims(&self, namespace: Option<&str>) -> Result<Vec<ResourceClaim>, ApiError> {
        match namespace {
            None => self.list(Api::all(self.client.clone()), "listing ResourceClaims of all namespaces").await,
            Some(ns) => self.list(Api::namespaced(self.client.clone(), ns), &format!("listing ResourceClaims in {ns}")).await,
        }
    }

    /// All DeviceClasses.
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn classes(&self) -> Result<Vec<DeviceClass>, ApiError> {
        self.list(Api::all(self.client.clone()), "listing DeviceClasses").await
    }

    /// Every object of `resource` in `namespace` (all when `None`), as JSON; none when the API
    /// server does not serve the resource (a CRD not installed).
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn objects(&self, resource: &ApiResource, namespace: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let what = format!("listing {}", resource.plural);
        match self.list(api, &what).await {
            Ok(items) => Ok(items.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect()),
            Err(ApiError::Call { source: kube::Error::Api(s), .. }) if s.code == 404 => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// How the API server's release rounds capacity requests (from its `/version`; the rounding
    /// of 1.37 and before when it does not say).
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn rounding(&self) -> Result<vgpu_scheduling::Rounding, ApiError> {
        let info = self.deadline("reading the server version", self.client.apiserver_version()).await?;
        let minor: String = info.minor.chars().take_while(char::is_ascii_digit).collect();
        Ok(minor.parse().map_or(vgpu_scheduling::Rounding::Whole, vgpu_scheduling::Rounding::of_release))
    }

    /// The DeviceTaintRules, from the newest API version that lists any (`v1` from Kubernetes
    /// 1.37, `v1beta2` where 1.36 has it switched on); none where no version is served.
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call (a refusal included).
    pub async fn taint_rules(&self) -> Result<Vec<crate::taint_rules::TaintRule>, ApiError> {
        for version in crate::taint_rules::VERSIONS {
            let resource = ApiResource {
                group: "resource.k8s.io".into(),
                version: version.into(),
                api_version: format!("resource.k8s.io/{version}"),
                kind: "DeviceTaintRule".into(),
                plural: "devicetaintrules".into(),
            };
            let rules: Vec<_> =
                self.objects(&resource, None).await?.iter().filter_map(crate::taint_rules::TaintRule::parse).collect();
            if !rules.is_empty() {
                return Ok(rules);
            }
        }
        Ok(Vec::new())
    }

    /// The ResourceQuotas of `namespace`.
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn quotas(&self, namespace: &str) -> Result<Vec<ResourceQuota>, ApiError> {
        self.list(Api::namespaced(self.client.clone(), namespace), &format!("listing ResourceQuotas in {namespace}")).await
    }

    /// The events about pod `namespace/name`, oldest first as the API lists them.
    ///
    /// # Errors
    /// [`ApiError`] for a failed or late call.
    pub async fn pod_events(&self, namespace: &str, name: &str) -> Result<Vec<Event>, ApiError> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().fields(&format!("involvedObject.kind=Pod,involvedObject.name={name}"));
        Ok(self.deadline(&format!("listing the events of pod {namespace}/{name}"), api.list(&params)).await?.items)
    }

    /// The metrics page of each running pod that `selector` selects (the node drivers), read
    /// through the API server's pod proxy on the pod's port named `metrics` (9394 when none is
    /// named): one entry per pod, with its page or why it could not be read.
    ///
    /// # Errors
    /// [`ApiError`] when the pods cannot be listed; a pod's page that fails is its entry's error.
    pub async fn driver_metrics(&self, selector: &str) -> Result<Vec<(String, Result<String, ApiError>)>, ApiError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().labels(selector);
        let pods = self.deadline(&format!("listing the driver pods ({selector})"), api.list(&params)).await?.items;
        let mut pages = Vec::new();
        for pod in pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")) {
            let (Some(namespace), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
                continue;
            };
            let port = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some("metrics"))
                .map_or(DRIVER_METRICS_PORT, |p| p.container_port);
            let path = format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/metrics");
            let page = match http::Request::get(&path).body(Vec::new()) {
                Ok(request) => self.deadline(&format!("reading {path}"), self.client.request_text(request)).await,
                Err(e) => Err(ApiError::Call { what: path.clone(), source: kube::Error::HttpError(e) }),
            };
            pages.push((format!("{namespace}/{name}"), page));
        }
        Ok(pages)
    }

    /// The pod `namespace/name`.
    ///
    /// # Errors
    /// [`ApiError::PodNotFound`], or another [`ApiError`] for a failed or late call.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Pod, ApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        self.deadline(&format!("getting pod {namespace}/{name}"), api.get_opt(name))
            .await?
            .ok_or_else(|| ApiError::PodNotFound { namespace: namespace.to_owned(), name: name.to_owned() })
    }
}
