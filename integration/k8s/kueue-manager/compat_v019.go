//go:build kueue_v019

// What Kueue v0.19's API asks of the wiring in main.go: a resource formatter shared by the cache,
// queues, scheduler and Workload controller (quota resources counted from DRA counters or
// consumable capacity print in binary units, 8Gi not 8589934592), and the ResourceSlice informer
// and index that counter and consumable-capacity quotas read devices from.
package main

import (
	"k8s.io/apimachinery/pkg/util/sets"
	ctrl "sigs.k8s.io/controller-runtime"

	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/config"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	"sigs.k8s.io/kueue/pkg/dra"
	"sigs.k8s.io/kueue/pkg/resources"
	"sigs.k8s.io/kueue/pkg/scheduler"
	utildra "sigs.k8s.io/kueue/pkg/util/dra"
)

// unlinkedInRelease are this release's gates, besides unlinked's, whose code is left out: the
// scheduling simulator (off by default).
var unlinkedInRelease = []string{"SchedulerLibraryIntegration"}

// release holds the wiring that differs between Kueue releases.
type release struct {
	formatter *resources.ResourceFormatter
	// resourceSlices: the ResourceSlice API is served and a gate that reads it
	// (KueueDRAIntegrationPartitionableDevices, KueueDRAIntegrationConsumableCapacity) is on.
	resourceSlices bool
}

func newRelease(mgr ctrl.Manager, mapper *dra.ResourceMapper) *release {
	formatter := resources.NewResourceFormatter()
	for _, name := range append(mapper.CounterBasedResourceNames(), mapper.CapacityBasedResourceNames()...) {
		formatter.RegisterBinaryFormattedResource(name)
	}
	return &release{formatter: formatter, resourceSlices: utildra.CheckResourceSliceAPIAvailable(mgr)}
}

func (r *release) cacheOptions() []schdcache.Option {
	return []schdcache.Option{schdcache.WithResourceFormatter(r.formatter)}
}

func (r *release) queueOptions() []qcache.Option {
	return []qcache.Option{qcache.WithResourceFormatter(r.formatter)}
}

func (r *release) schedulerOptions() []scheduler.Option {
	return []scheduler.Option{scheduler.WithResourceFormatter(r.formatter)}
}

func (r *release) setCoreOptions(opts *core.SetupControllersOpts) {
	opts.ResourceFormatter = r.formatter
	opts.ResourceSliceAPIAvailable = r.resourceSlices
}

func addWebhookSettings(options *ctrl.Options, cfg *configapi.Configuration) error {
	return config.AddWebhookSettingsTo(options, cfg)
}

func labelKeysToCopy(cfg *configapi.Configuration) jobframework.Option {
	return jobframework.WithLabelKeysToCopy(sets.New(cfg.Integrations.LabelKeysToCopy...))
}
