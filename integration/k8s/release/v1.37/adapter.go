// Release-specific glue for kubelet-sim, Kubernetes 1.37: plugin handler methods take a context,
// and the kubelet consumes DRA health through dra-health/v1. build.sh copies the newest adapter
// whose release is not newer than the one being built.
package main

import (
	"context"
	"time"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
)

func (h *handler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return h.pm.ValidatePlugin(ctx, name, endpoint, h.filter(versions))
}

func (h *handler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.pm.RegisterPlugin(ctx, name, endpoint, h.filter(versions), timeout)
	h.registered(name, endpoint, versions, err)
	return err
}

func (h *handler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.pm.DeRegisterPlugin(ctx, name, endpoint)
	h.deregistered(name, endpoint)
}

func (p *healthPrinter) HandleWatchResourcesStream(ctx context.Context, stream drahealthv1.DRAResourceHealth_NodeWatchResourcesClient, driver string) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		p.out.emit(map[string]any{"event": "health", "driver": driver, "devices": resp.GetDevices()})
	}
}
