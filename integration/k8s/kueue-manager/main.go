// kueue-manager is Kueue's controller manager for the test bed: Kueue's own controllers, scheduler,
// caches and admission webhooks, wired the way kueue-controller-manager wires them, with one job
// integration linked: batch/v1 Job. One source for Kueue v0.18 and v0.19: what differs between
// the two releases' APIs is in compat_v018.go and compat_v019.go, chosen by the build tag
// kueue_v019 (build.sh builds v0.19.x with it, beside its compat file only).
//
// Why not Kueue's cmd/kueue: it links every job integration, one of which (Kubeflow Trainer) Kueue
// pins at a commit the Go module proxy does not serve; and with Kueue's internal certificate
// management off it reads the metrics certificate from a fixed path under /etc. Here the webhook
// server takes its certificate from the Configuration (webhook.certDir, tls.crt and tls.key) and
// the metrics server is plain HTTP on the configured address (the test bed binds it to loopback).
// Left out: MultiKueue, provisioning requests, concurrent admission, failure recovery, the
// visibility server, leader election and (v0.19) the scheduling simulator of
// SchedulerLibraryIntegration; a Configuration or feature gate asking for them is refused rather
// than ignored.
//
//	kueue-manager --config FILE [--feature-gates K=V,...] [--kubeconfig FILE]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	configv1beta1 "sigs.k8s.io/kueue/apis/config/v1beta1"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueuev1alpha1 "sigs.k8s.io/kueue/apis/kueue/v1alpha1"
	kueuev1beta1 "sigs.k8s.io/kueue/apis/kueue/v1beta1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/config"
	"sigs.k8s.io/kueue/pkg/constants"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/core/indexer"
	"sigs.k8s.io/kueue/pkg/controller/elasticjobs"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	"sigs.k8s.io/kueue/pkg/controller/tas"
	tasindexer "sigs.k8s.io/kueue/pkg/controller/tas/indexer"
	"sigs.k8s.io/kueue/pkg/dra"
	"sigs.k8s.io/kueue/pkg/features"
	"sigs.k8s.io/kueue/pkg/metrics"
	"sigs.k8s.io/kueue/pkg/scheduler"
	preemptexpectations "sigs.k8s.io/kueue/pkg/scheduler/preemption/expectations"
	"sigs.k8s.io/kueue/pkg/scheduler/preemption/fairsharing"
	"sigs.k8s.io/kueue/pkg/util/kubeversion"
	"sigs.k8s.io/kueue/pkg/util/waitforpodsready"
	"sigs.k8s.io/kueue/pkg/webhooks"

	// The one job integration linked: batch/v1 Job (registers itself with jobframework).
	_ "sigs.k8s.io/kueue/pkg/controller/jobs/job"
)

var log = ctrl.Log.WithName("kueue-manager")

func main() {
	configFile := flag.String("config", "", "Kueue's manager Configuration (config.kueue.x-k8s.io/v1beta2)")
	featureGates := flag.String("feature-gates", "", "Kueue feature gates, key=value pairs")
	zapOptions := zap.Options{}
	zapOptions.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOptions)))
	if err := run(*configFile, *featureGates); err != nil {
		log.Error(err, "kueue-manager failed")
		os.Exit(1)
	}
}

func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, schedulingv1.AddToScheme, resourceapi.AddToScheme,
		kueue.AddToScheme, kueuev1beta1.AddToScheme, kueuev1alpha1.AddToScheme,
		configv1beta1.AddToScheme, configapi.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	err := jobframework.ForEachIntegration(func(_ string, cb jobframework.IntegrationCallbacks) error {
		if cb.AddToScheme != nil {
			return cb.AddToScheme(scheme)
		}
		return nil
	})
	return scheme, err
}

// unlinked are the feature gates whose controllers this binary leaves out, with the release's
// own (unlinkedInRelease): turned off here (two, MultiKueue and VisibilityOnDemand, are on by
// default in Kueue); turning one on is refused.
var unlinked = append([]string{"MultiKueue", "VisibilityOnDemand", "ConcurrentAdmission", "FailureRecoveryPolicy"},
	unlinkedInRelease...)

// withUnlinkedOff turns off each unlinked gate that neither the Configuration nor the command
// line names, where the gates are given (Kueue refuses gates given in both places), and returns
// the command line's gates.
func withUnlinkedOff(cfg *configapi.Configuration, featureGates string) string {
	for _, gate := range unlinked {
		if _, named := cfg.FeatureGates[gate]; named || strings.Contains(featureGates, gate+"=") {
			continue
		}
		if featureGates != "" {
			featureGates += "," + gate + "=false"
			continue
		}
		if cfg.FeatureGates == nil {
			cfg.FeatureGates = map[string]bool{}
		}
		cfg.FeatureGates[gate] = false
	}
	return featureGates
}

// refuseUnlinked fails on settings that ask for what this binary leaves out.
func refuseUnlinked(cfg *configapi.Configuration, featureGates string) error {
	if cfg.InternalCertManagement == nil || ptr.Deref(cfg.InternalCertManagement.Enable, true) {
		return errors.New("internalCertManagement.enable must be false: give webhook.certDir instead")
	}
	if cfg.LeaderElection != nil && ptr.Deref(cfg.LeaderElection.LeaderElect, false) {
		return errors.New("leaderElection.leaderElect must be false")
	}
	for _, gate := range unlinked {
		if cfg.FeatureGates[gate] || strings.Contains(featureGates, gate+"=true") {
			return fmt.Errorf("feature gate %s is not supported by kueue-manager", gate)
		}
	}
	return nil
}

func run(configFile, featureGates string) error {
	scheme, err := newScheme()
	if err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	options, cfg, err := config.Load(scheme, configFile)
	if err != nil {
		return fmt.Errorf("loading %s: %w", configFile, err)
	}
	if err := refuseUnlinked(&cfg, featureGates); err != nil {
		return err
	}
	if err := config.LoadAndValidateFeatureGates(withUnlinkedOff(&cfg, featureGates), cfg.FeatureGates).ToAggregate(); err != nil {
		return fmt.Errorf("feature gates: %w", err)
	}
	if err := config.Validate(&cfg, scheme).ToAggregate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	if err := addWebhookSettings(&options, &cfg); err != nil {
		return fmt.Errorf("webhook server: %w", err)
	}
	options.Metrics = metricsserver.Options{BindAddress: cfg.Metrics.BindAddress}
	metrics.Register()

	kubeConfig := ctrl.GetConfigOrDie()
	if qps := *cfg.ClientConnection.QPS; qps >= 0 {
		kubeConfig.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, int(*cfg.ClientConnection.Burst))
	}
	ctx := ctrl.SetupSignalHandler()
	mgr, err := ctrl.NewManager(kubeConfig, options)
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	var draMapper *dra.ResourceMapper
	var draBacked *dra.ExtendedResourceCache
	if features.Enabled(features.KueueDRAIntegration) {
		draMapper, draBacked = dra.NewResourceMapper(), dra.NewExtendedResourceCache()
		if cfg.Resources != nil && len(cfg.Resources.DeviceClassMappings) > 0 {
			if err := draMapper.PopulateFromConfiguration(cfg.Resources.DeviceClassMappings); err != nil {
				return fmt.Errorf("deviceClassMappings: %w", err)
			}
		}
	}
	rel := newRelease(mgr, draMapper)
	cacheOpts, queueOpts := cacheOptions(&cfg)
	cacheOpts = append(cacheOpts, rel.cacheOptions()...)
	queueOpts = append(queueOpts, rel.queueOptions()...)
	if draBacked != nil {
		queueOpts = append(queueOpts, qcache.WithDRABackedResources(draBacked))
	}
	cCache := schdcache.New(mgr.GetClient(), cacheOpts...)
	requeuer := qcache.NewRequeuer()
	if err := mgr.Add(requeuer); err != nil {
		return fmt.Errorf("adding the requeuer: %w", err)
	}
	expectations := preemptexpectations.New()
	queueOpts = append(queueOpts, qcache.WithPreemptionExpectations(expectations))
	queues := qcache.NewManager(mgr.GetClient(), cCache, requeuer, queueOpts...)

	if err := indexer.Setup(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("indexes: %w", err)
	}
	if rel.resourceSlices {
		if err := core.SetupResourceSliceIndexer(ctx, mgr.GetFieldIndexer()); err != nil {
			return fmt.Errorf("ResourceSlice index: %w", err)
		}
	}
	if features.Enabled(features.TopologyAwareScheduling) {
		if err := tasindexer.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
			return fmt.Errorf("topology indexes: %w", err)
		}
	}
	if err := jobframework.SetupIndexes(ctx, mgr.GetFieldIndexer(),
		jobframework.WithEnabledFrameworks(cfg.Integrations.Frameworks)); err != nil {
		return fmt.Errorf("job indexes: %w", err)
	}
	versions, err := serverVersions(mgr, kubeConfig)
	if err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	// Ready once the webhook server listens, as Kueue's own manager reports it.
	if err := mgr.AddReadyzCheck("readyz", func(req *http.Request) error {
		return mgr.GetWebhookServer().StartedChecker()(req)
	}); err != nil {
		return err
	}

	coreOpts := core.SetupControllersOpts{PreemptionExpectations: expectations, DRAMapper: draMapper, DRABackedResources: draBacked}
	rel.setCoreOptions(&coreOpts)
	if failed, err := core.SetupControllers(mgr, queues, cCache, &cfg, coreOpts); err != nil {
		return fmt.Errorf("controller %s: %w", failed, err)
	}
	if features.Enabled(features.TopologyAwareScheduling) {
		if failed, err := tas.SetupControllers(mgr, queues, cCache, &cfg, nil); err != nil {
			return fmt.Errorf("topology controller %s: %w", failed, err)
		}
	}
	if features.Enabled(features.ElasticJobsViaWorkloadSlices) {
		if failed, err := elasticjobs.SetupWithManager(mgr, &cfg, nil); err != nil {
			return fmt.Errorf("elastic jobs controller %s: %w", failed, err)
		}
	}
	if err := setupJobs(ctx, mgr, cCache, queues, &cfg, versions); err != nil {
		return err
	}
	if failed, err := webhooks.Setup(mgr, nil); err != nil {
		return fmt.Errorf("webhook %s: %w", failed, err)
	}
	go queues.CleanUpOnContext(ctx)
	go cCache.CleanUpOnContext(ctx)

	schedOpts := append([]scheduler.Option{
		scheduler.WithFairSharing(cfg.FairSharing),
		scheduler.WithAdmissionFairSharing(cfg.AdmissionFairSharing),
		scheduler.WithPreemptionExpectations(expectations),
	}, rel.schedulerOptions()...)
	sched := scheduler.New(queues, cCache, mgr.GetClient(), mgr.GetEventRecorder(constants.AdmissionName), schedOpts...)
	if err := mgr.Add(sched); err != nil {
		return fmt.Errorf("adding the scheduler: %w", err)
	}
	log.Info("starting", "webhookPort", ptr.Deref(cfg.Webhook.Port, 0), "metrics", cfg.Metrics.BindAddress,
		"health", cfg.Health.HealthProbeBindAddress, "frameworks", cfg.Integrations.Frameworks)
	return mgr.Start(ctx)
}

// cacheOptions are the options the scheduler's cache and the queues share (transformations,
// excluded resources, fair sharing).
func cacheOptions(cfg *configapi.Configuration) ([]schdcache.Option, []qcache.Option) {
	blockForPodsReady := waitforpodsready.Enabled(cfg.WaitForPodsReady) && ptr.Deref(cfg.WaitForPodsReady.BlockAdmission, false)
	cacheOpts := []schdcache.Option{
		schdcache.WithResourceMetrics(cfg.Metrics.EnableClusterQueueResources),
		schdcache.WithPodsReadyTracking(blockForPodsReady),
	}
	queueOpts := []qcache.Option{qcache.WithResourceMetrics(cfg.Metrics.EnableClusterQueueResources)}
	if r := cfg.Resources; r != nil {
		if len(r.ExcludeResourcePrefixes) > 0 {
			cacheOpts = append(cacheOpts, schdcache.WithExcludedResourcePrefixes(r.ExcludeResourcePrefixes))
			queueOpts = append(queueOpts, qcache.WithExcludedResourcePrefixes(r.ExcludeResourcePrefixes))
		}
		if len(r.Transformations) > 0 {
			cacheOpts = append(cacheOpts, schdcache.WithResourceTransformations(r.Transformations))
			queueOpts = append(queueOpts, qcache.WithResourceTransformations(r.Transformations))
		}
	}
	if cfg.FairSharing != nil {
		cacheOpts = append(cacheOpts, schdcache.WithFairSharing(fairsharing.Enabled(cfg.FairSharing)))
	}
	if cfg.AdmissionFairSharing != nil {
		cacheOpts = append(cacheOpts, schdcache.WithAdmissionFairSharing(cfg.AdmissionFairSharing))
		queueOpts = append(queueOpts, qcache.WithAdmissionFairSharing(cfg.AdmissionFairSharing))
	}
	return cacheOpts, queueOpts
}

func serverVersions(mgr ctrl.Manager, kubeConfig *rest.Config) (*kubeversion.ServerVersionFetcher, error) {
	client, err := discovery.NewDiscoveryClientForConfig(kubeConfig)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	fetcher := kubeversion.NewServerVersionFetcher(client)
	if err := mgr.Add(fetcher); err != nil {
		return nil, err
	}
	if err := fetcher.FetchServerVersion(); err != nil {
		return nil, fmt.Errorf("fetching the server version: %w", err)
	}
	return fetcher, nil
}

// setupJobs starts the reconcilers and webhooks of the linked job integrations.
func setupJobs(ctx context.Context, mgr ctrl.Manager, cCache *schdcache.Cache, queues *qcache.Manager,
	cfg *configapi.Configuration, versions *kubeversion.ServerVersionFetcher) error {
	selector, err := metav1.LabelSelectorAsSelector(cfg.ManagedJobsNamespaceSelector)
	if err != nil {
		return fmt.Errorf("managedJobsNamespaceSelector: %w", err)
	}
	err = jobframework.SetupControllers(ctx, mgr, log,
		jobframework.WithManageJobsWithoutQueueName(cfg.ManageJobsWithoutQueueName),
		jobframework.WithWaitForPodsReady(cfg.WaitForPodsReady),
		jobframework.WithKubeServerVersion(versions),
		jobframework.WithEnabledFrameworks(cfg.Integrations.Frameworks),
		jobframework.WithEnabledExternalFrameworks(cfg.Integrations.ExternalFrameworks),
		jobframework.WithManagerName(constants.KueueName),
		labelKeysToCopy(cfg),
		jobframework.WithCache(cCache),
		jobframework.WithQueues(queues),
		jobframework.WithObjectRetentionPolicies(cfg.ObjectRetentionPolicies),
		jobframework.WithManagedJobsNamespaceSelector(selector))
	if err != nil {
		return fmt.Errorf("job integrations: %w", err)
	}
	return nil
}
