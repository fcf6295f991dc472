//go:build !kueue_v019

// What Kueue v0.18's API asks of the wiring in main.go.
package main

import (
	ctrl "sigs.k8s.io/controller-runtime"

	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/config"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	"sigs.k8s.io/kueue/pkg/dra"
	"sigs.k8s.io/kueue/pkg/features"
	"sigs.k8s.io/kueue/pkg/scheduler"
)

// unlinkedInRelease are this release's gates, besides unlinked's, whose code is left out.
var unlinkedInRelease []string

// release holds the wiring that differs between Kueue releases.
type release struct {
	// resourceSlices: index ResourceSlices (v0.18: for partitionable devices only).
	resourceSlices bool
}

func newRelease(_ ctrl.Manager, _ *dra.ResourceMapper) *release {
	return &release{resourceSlices: features.Enabled(features.KueueDRAIntegrationPartitionableDevices)}
}

func (*release) cacheOptions() []schdcache.Option          { return nil }
func (*release) queueOptions() []qcache.Option             { return nil }
func (*release) schedulerOptions() []scheduler.Option      { return nil }
func (*release) setCoreOptions(*core.SetupControllersOpts) {}

func addWebhookSettings(options *ctrl.Options, cfg *configapi.Configuration) error {
	config.AddWebhookSettingsTo(options, cfg)
	return nil
}

func labelKeysToCopy(cfg *configapi.Configuration) jobframework.Option {
	return jobframework.WithLabelKeysToCopy(cfg.Integrations.LabelKeysToCopy)
}
