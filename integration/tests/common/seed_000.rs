//! Source document 000's manifests, unchanged but where a comment says so: the Volcano tests run
//! them, the webhook tests convert them, and docs/volcano.md shows them (checked by a test).

/// The namespace 000 runs its examples in.
pub const DEMO: &str = "volcano-demo";

/// Source document 000's single pod, unchanged.
pub const SINGLE: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: volcano-vgpu-single
  namespace: volcano-demo
spec:
  schedulerName: volcano
  restartPolicy: Never
  containers:
  - name: cuda
    image: nvidia/cuda:11.0.3-base-ubuntu18.04
    imagePullPolicy: IfNotPresent
    command:
    - bash
    - -lc
    - |
      echo "===== GPU ENV ====="
      env | grep -E 'CUDA_DEVICE|NVIDIA_VISIBLE_DEVICES|VGPU|VOLCANO' || true
      echo "===== NVIDIA SMI ====="
      nvidia-smi
      sleep 3600
    resources:
      limits:
        volcano.sh/vgpu-number: 1
        volcano.sh/vgpu-memory: 2000
        volcano.sh/vgpu-cores: 30
"#;

/// Source document 000's gang of two workers, unchanged (its command shortened).
pub const GANG: &str = r#"apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vcjob-vgpu-gang
  namespace: volcano-demo
spec:
  schedulerName: volcano
  queue: default
  minAvailable: 2
  maxRetry: 1
  tasks:
  - name: vgpu-worker
    replicas: 2
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: cuda
          image: nvidia/cuda:11.0.3-base-ubuntu18.04
          imagePullPolicy: IfNotPresent
          command:
          - bash
          - -lc
          - |
            echo "worker: $(hostname)"
            nvidia-smi
            sleep 3600
          resources:
            limits:
              volcano.sh/vgpu-number: 1
              volcano.sh/vgpu-memory: 3000
              volcano.sh/vgpu-cores: 30
"#;

/// Source document 000's gang of two 9000 MiB workers, unchanged.
pub const GANG_INSUFFICIENT: &str = r#"apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vcjob-vgpu-gang-insufficient
  namespace: volcano-demo
spec:
  schedulerName: volcano
  queue: default
  minAvailable: 2
  maxRetry: 1
  tasks:
  - name: vgpu-worker
    replicas: 2
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: cuda
          image: nvidia/cuda:11.0.3-base-ubuntu18.04
          imagePullPolicy: IfNotPresent
          command: ["bash", "-lc", "nvidia-smi; sleep 3600"]
          resources:
            limits:
              volcano.sh/vgpu-number: 1
              volcano.sh/vgpu-memory: 9000
              volcano.sh/vgpu-cores: 30
"#;

/// Source document 000's queue, its vGPU capability written in Volcano's DRA keys for the
/// vgpu-dra DeviceClass: `volcano.sh/vgpu-number: "2"` is the count of devices the queue's claims
/// may hold (`deviceclass/<class>`; every claim of the webhook holds one device of the card, one
/// share), `volcano.sh/vgpu-memory: "6000"` (MiB) is `memory.deviceclass/<class>: 6000Mi`, and
/// `volcano.sh/vgpu-cores: "60"` is `cores.deviceclass/<class>: "60"`; cpu and memory unchanged.
pub const QUEUE: &str = r#"apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: gpu-small-queue
spec:
  weight: 1
  reclaimable: false
  capability:
    cpu: "2"
    memory: "4Gi"
    deviceclass/hami-core-gpu.project-hami.io: "2"
    memory.deviceclass/hami-core-gpu.project-hami.io: "6000Mi"
    cores.deviceclass/hami-core-gpu.project-hami.io: "60"
"#;

/// Source document 000's Job within the queue's capability, unchanged.
pub const QUEUE_FIT: &str = r#"apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vcjob-vgpu-queue-fit
  namespace: volcano-demo
spec:
  schedulerName: volcano
  queue: gpu-small-queue
  minAvailable: 2
  tasks:
  - name: vgpu-worker
    replicas: 2
    policies:
    - event: TaskCompleted
      action: CompleteJob
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: cuda
          image: nvidia/cuda:11.0.3-base-ubuntu18.04
          command: ["bash", "-lc", "nvidia-smi; sleep 60"]
          resources:
            limits:
              volcano.sh/vgpu-number: 1
              volcano.sh/vgpu-memory: 3000
              volcano.sh/vgpu-cores: 30
"#;

/// Source document 000's Job over the queue's capability, unchanged.
pub const QUEUE_EXCEEDS: &str = r#"apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vcjob-vgpu-queue-exceeds
  namespace: volcano-demo
spec:
  schedulerName: volcano
  queue: gpu-small-queue
  minAvailable: 2
  tasks:
  - name: vgpu-worker
    replicas: 2
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: cuda
          image: nvidia/cuda:11.0.3-base-ubuntu18.04
          command: ["bash", "-lc", "nvidia-smi; sleep 60"]
          resources:
            limits:
              volcano.sh/vgpu-number: 1
              volcano.sh/vgpu-memory: 4500
              volcano.sh/vgpu-cores: 30
"#;
