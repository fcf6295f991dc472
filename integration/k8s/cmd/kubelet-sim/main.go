// Command kubelet-sim is the kubelet's side of the DRA plugin protocol, made of the kubelet's own
// code: its plugin manager watches a plugins_registry directory and registers DRA plugins through
// the DRA plugin manager, exactly as the kubelet does, and the prepare/unprepare calls go through
// the kubelet's DRA client wrapper (which picks v1 or v1beta1 the way the kubelet does).
//
// Commands are read from stdin, one JSON object per line; every answer and event is one JSON
// object per line on stdout:
//
//	{"op":"prepare","claims":[{"namespace":"ns","name":"c","uid":"..."}]}
//	{"op":"unprepare","claims":[...]}
//	{"op":"wipe"}            delete the node's ResourceSlices, as a starting kubelet does
//	{"op":"quit"}
//
// Events: {"event":"registered",...}, {"event":"deregistered",...}, {"event":"health",...}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// out serialises JSON lines from the command loop, the plugin manager and the health streams.
type out struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *out) emit(v any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(v)
}

// handler is the kubelet's DRA registration handler, reporting each registration as an event and
// optionally hiding services from the kubelet side to force an older protocol version.
type handler struct {
	pm      *plugin.DRAPluginManager
	out     *out
	allowed []string
}

func (h *handler) filter(versions []string) []string {
	if len(h.allowed) == 0 {
		return versions
	}
	var kept []string
	for _, v := range versions {
		if slices.Contains(h.allowed, v) {
			kept = append(kept, v)
		}
	}
	return kept
}

func (h *handler) registered(name, endpoint string, versions []string, err error) {
	ev := map[string]any{"event": "registered", "driver": name, "endpoint": endpoint, "versions": versions}
	if err != nil {
		ev["error"] = err.Error()
	}
	h.out.emit(ev)
}

func (h *handler) deregistered(name, endpoint string) {
	h.out.emit(map[string]any{"event": "deregistered", "driver": name, "endpoint": endpoint})
}

// healthPrinter is the kubelet's health stream consumer, printing every update it receives; its
// stream type differs between releases (see adapter.go).
type healthPrinter struct{ out *out }

// sources tells the plugin manager that all pod sources are ready, as a running kubelet would.
type sources struct{}

var _ config.SourcesReady = sources{}

func (sources) AddSource(string) {}
func (sources) AllReady() bool   { return true }

type command struct {
	Op     string           `json:"op"`
	Claims []*drapbv1.Claim `json:"claims"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	nodeName := flag.String("node-name", "", "the node this kubelet runs as")
	registry := flag.String("plugins-registry", "", "directory watched for registration sockets")
	driver := flag.String("driver", "", "DRA driver to call")
	services := flag.String("services", "", "comma-separated DRA services the kubelet side accepts (default: all it knows)")
	wipeDelay := flag.Duration("wiping-delay", 30*time.Second, "how long after losing the plugin the node's slices are wiped")
	health := flag.Bool("health", true, "consume the DRA health stream (feature ResourceHealthStatus)")
	klog.InitFlags(nil)
	flag.Parse()
	if *nodeName == "" || *registry == "" || *driver == "" {
		fmt.Fprintln(os.Stderr, "kubelet-sim: --node-name, --plugins-registry and --driver are required")
		os.Exit(2)
	}
	if err := utilfeature.DefaultMutableFeatureGate.Set(fmt.Sprintf("ResourceHealthStatus=%t,ResourceHealthStatusMessage=%t", *health, *health)); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-sim:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := &out{enc: json.NewEncoder(os.Stdout)}

	var client kubernetes.Interface
	if *kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubelet-sim:", err)
			os.Exit(2)
		}
		client = kubernetes.NewForConfigOrDie(cfg)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *nodeName, metav1.GetOptions{})
	}
	var hp plugin.StreamHandler
	if *health {
		hp = &healthPrinter{out: o}
	}
	// Like the kubelet, the manager wipes the node's slices at start (when it has a client).
	dra := plugin.NewDRAPluginManager(ctx, client, getNode, hp, *wipeDelay)
	defer dra.Stop()
	var allowed []string
	if *services != "" {
		allowed = strings.Split(*services, ",")
	}
	pm := pluginmanager.NewPluginManager(*registry, record.NewFakeRecorder(100))
	pm.AddHandler("DRAPlugin", cache.PluginHandler(&handler{pm: dra, out: o, allowed: allowed}))
	go pm.Run(ctx, sources{}, ctx.Done())

	lines := make(chan string)
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		scanner.Buffer(make([]byte, 1<<20), 1<<24)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case line, ok := <-lines:
			if !ok {
				return
			}
			if strings.TrimSpace(line) == "" {
				continue
			}
			var cmd command
			if err := json.Unmarshal([]byte(line), &cmd); err != nil {
				o.emit(map[string]any{"op": "invalid", "error": err.Error()})
				continue
			}
			if cmd.Op == "quit" {
				return
			}
			o.emit(run(ctx, dra, client, *driver, *nodeName, cmd))
		}
	}
}

// run executes one command through the kubelet's own client code.
func run(ctx context.Context, dra *plugin.DRAPluginManager, client kubernetes.Interface, driver, node string, cmd command) map[string]any {
	res := map[string]any{"op": cmd.Op}
	fail := func(err error) map[string]any {
		res["error"] = err.Error()
		return res
	}
	start := time.Now()
	defer func() { res["seconds"] = time.Since(start).Seconds() }()
	switch cmd.Op {
	case "prepare", "unprepare":
		p, err := dra.GetPlugin(driver)
		if err != nil {
			return fail(err)
		}
		if cmd.Op == "prepare" {
			resp, err := p.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: cmd.Claims})
			if err != nil {
				return fail(err)
			}
			res["response"] = resp
		} else {
			resp, err := p.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: cmd.Claims})
			if err != nil {
				return fail(err)
			}
			res["response"] = resp
		}
	case "wipe":
		if client == nil {
			return fail(fmt.Errorf("wipe needs --kubeconfig"))
		}
		sel := fields.Set{"spec.nodeName": node}.String()
		if err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel}); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unknown op %q", cmd.Op))
	}
	return res
}
