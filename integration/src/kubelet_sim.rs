//! The kubelet side of the DRA plugin protocol, driven through `kubelet-sim` (the kubelet's own
//! plugin manager and DRA client code): registration events, prepare and unprepare calls.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::{components, patience};

/// Options of a kubelet-sim run.
#[derive(Debug, Clone, Default)]
pub struct KubeletSimOptions {
    /// Kubeconfig; without one the slice wipe at start and on plugin loss is off.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Node name.
    pub node_name: String,
    /// Restrict the DRA services the kubelet side accepts (to force v1beta1).
    pub services: Option<String>,
    /// Consume the health stream.
    pub health: bool,
    /// Delay before the node's slices are wiped after the plugin is lost.
    pub wiping_delay: Option<Duration>,
}

/// A running kubelet-sim.
pub struct KubeletSim {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    /// Events seen while waiting for replies (registrations, health updates), in order.
    pub events: Vec<Value>,
}

impl KubeletSim {
    /// Starts kubelet-sim watching `registry` for plugins of `driver`.
    ///
    /// # Errors
    /// When the binary is missing or does not start.
    pub fn start(registry: &Path, driver: &str, opts: &KubeletSimOptions) -> anyhow::Result<Self> {
        let bin = &components()?.kubelet_sim;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"]).arg(bin);
        cmd.arg(format!("--plugins-registry={}", registry.display()))
            .arg(format!("--driver={driver}"))
            .arg(format!("--node-name={}", if opts.node_name.is_empty() { "node-a" } else { &opts.node_name }))
            .arg(format!("--health={}", opts.health))
            .arg(format!("--v={}", std::env::var("VGPU_DRA_KUBELET_SIM_V").unwrap_or_else(|_| "0".into())));
        if let Some(kc) = &opts.kubeconfig {
            cmd.arg(format!("--kubeconfig={}", kc.display()));
        }
        if let Some(s) = &opts.services {
            cmd.arg(format!("--services={s}"));
        }
        if let Some(d) = opts.wiping_delay {
            cmd.arg(format!("--wiping-delay={}ms", d.as_millis()));
        }
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().context("starting kubelet-sim")?;
        let stdin = child.stdin.take().context("kubelet-sim stdin")?;
        let stdout = child.stdout.take().context("kubelet-sim stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        Ok(Self { child, stdin, lines, events: Vec::new() })
    }

    fn next(&mut self, deadline: Instant) -> anyhow::Result<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Timeout) => bail!("kubelet-sim said nothing in time"),
            Err(RecvTimeoutError::Disconnected) => bail!("kubelet-sim exited: {:?}", self.child.try_wait()),
        }
    }

    /// Waits for an event of kind `event` (`registered`, `deregistered`, `health`) that `matches`.
    ///
    /// # Errors
    /// When none arrives within `timeout` (scaled by patience).
    pub fn wait_event(&mut self, event: &str, timeout: Duration, matches: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        if let Some(e) = self.events.iter().find(|e| e["event"] == event && matches(e)) {
            return Ok(e.clone());
        }
        let deadline = Instant::now() + timeout.mul_f64(patience());
        loop {
            let v = self.next(deadline).with_context(|| format!("waiting for a {event} event"))?;
            self.events.push(v.clone());
            if v["event"] == event && matches(&v) {
                return Ok(v);
            }
        }
    }

    /// Sends one command and returns its reply (events arriving meanwhile are kept).
    ///
    /// # Errors
    /// When kubelet-sim does not answer within a minute.
    pub fn call(&mut self, command: &Value) -> anyhow::Result<Value> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        let deadline = Instant::now() + Duration::from_secs(60).mul_f64(patience());
        loop {
            let v = self.next(deadline)?;
            if v.get("op").is_some() {
                return Ok(v);
            }
            self.events.push(v);
        }
    }

    /// `NodePrepareResources` for `(namespace, name, uid)` claims; returns the reply.
    ///
    /// # Errors
    /// When kubelet-sim does not answer.
    pub fn prepare(&mut self, claims: &[(&str, &str, &str)]) -> anyhow::Result<Value> {
        self.call(&json!({"op": "prepare", "claims": claim_list(claims)}))
    }

    /// `NodeUnprepareResources` for `(namespace, name, uid)` claims; returns the reply.
    ///
    /// # Errors
    /// When kubelet-sim does not answer.
    pub fn unprepare(&mut self, claims: &[(&str, &str, &str)]) -> anyhow::Result<Value> {
        self.call(&json!({"op": "unprepare", "claims": claim_list(claims)}))
    }
}

fn claim_list(claims: &[(&str, &str, &str)]) -> Vec<Value> {
    claims.iter().map(|(ns, name, uid)| json!({"namespace": ns, "name": name, "uid": uid})).collect()
}

impl Drop for KubeletSim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
