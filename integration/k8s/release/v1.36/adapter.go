// Release-specific glue for kubelet-sim, Kubernetes 1.36: plugin handler methods without a
// context, and the DRA health stream of dra-health/v1alpha1. build.sh copies the newest adapter
// whose release is not newer than the one being built.
package main

import (
	"context"
	"time"

	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

func (h *handler) ValidatePlugin(name, endpoint string, versions []string) error {
	return h.pm.ValidatePlugin(name, endpoint, h.filter(versions))
}

func (h *handler) RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.pm.RegisterPlugin(name, endpoint, h.filter(versions), timeout)
	h.registered(name, endpoint, versions, err)
	return err
}

func (h *handler) DeRegisterPlugin(name, endpoint string) {
	h.pm.DeRegisterPlugin(name, endpoint)
	h.deregistered(name, endpoint)
}

func (p *healthPrinter) HandleWatchResourcesStream(ctx context.Context, stream drahealthv1alpha1.DRAResourceHealth_NodeWatchResourcesClient, driver string) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		p.out.emit(map[string]any{"event": "health", "driver": driver, "devices": resp.GetDevices()})
	}
}
