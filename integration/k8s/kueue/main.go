// kueue-check decodes a Kueue manager Configuration the way kueue-controller-manager reads its
// config file: Kueue's own API types and defaults, with strict decoding, so an unknown or
// misspelled field or a wrong type is refused. It prints the resource transformations it read.
//
// Kueue's semantic validation (pkg/config) is not linked: it pulls in every job integration,
// some of whose modules the module proxy does not serve.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kueue-check CONFIG.yaml")
		os.Exit(2)
	}
	content, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(configapi.AddToScheme(scheme))
	codecs := serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	var cfg configapi.Configuration
	if err := runtime.DecodeInto(codecs.UniversalDecoder(), content, &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]any{"resources": cfg.Resources, "integrations": cfg.Integrations})
	fmt.Println(string(out))
}
