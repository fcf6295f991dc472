// Command cdi-check loads a CDI spec directory with the reference CDI library (the code container
// runtimes use), reports every validation error, and injects the given qualified device IDs into
// an empty OCI runtime spec, printing what a container would get as one JSON object:
//
//	cdi-check --spec-dir /var/run/cdi [--inject vendor/class=name,...]
//
// Exit status: 0 when the directory is valid and every device resolved, 1 otherwise.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type report struct {
	Devices     []string            `json:"devices"`
	Errors      map[string][]string `json:"errors"`
	Unresolved  []string            `json:"unresolved,omitempty"`
	InjectError string              `json:"injectError,omitempty"`
	Env         []string            `json:"env,omitempty"`
	Mounts      []oci.Mount         `json:"mounts,omitempty"`
	DeviceNodes []oci.LinuxDevice   `json:"deviceNodes,omitempty"`
	Hooks       *oci.Hooks          `json:"hooks,omitempty"`
	Annotations map[string]string   `json:"annotations,omitempty"`
}

func main() {
	specDir := flag.String("spec-dir", "", "CDI spec directory to load")
	inject := flag.String("inject", "", "comma-separated qualified CDI device IDs to inject")
	flag.Parse()
	if *specDir == "" {
		fmt.Fprintln(os.Stderr, "cdi-check: --spec-dir is required")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(*specDir), cdi.WithAutoRefresh(false))
	rep := report{Errors: map[string][]string{}}
	if err != nil {
		rep.Errors["<cache>"] = []string{err.Error()}
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			rep.Errors[path] = append(rep.Errors[path], e.Error())
		}
	}
	rep.Devices = cache.ListDevices()
	if *inject != "" {
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		unresolved, err := cache.InjectDevices(spec, strings.Split(*inject, ",")...)
		rep.Unresolved = unresolved
		if err != nil {
			rep.InjectError = err.Error()
		}
		rep.Env = spec.Process.Env
		rep.Mounts = spec.Mounts
		rep.DeviceNodes = spec.Linux.Devices
		rep.Hooks = spec.Hooks
		rep.Annotations = spec.Annotations
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
	if len(rep.Errors) > 0 || len(rep.Unresolved) > 0 || rep.InjectError != "" {
		os.Exit(1)
	}
}
