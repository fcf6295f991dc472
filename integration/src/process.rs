//! Child processes that cannot outlive their test: killed on drop, and (through `setpriv
//! --pdeathsig`) by the kernel if the test process itself dies. Output goes to a log file that is
//! printed when the test fails.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;

/// A process started for a test.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ManagedProcess {
    /// Starts `program args` with stdout and stderr to `<log_dir>/<name>.log`.
    ///
    /// # Errors
    /// When the log file cannot be created or the program not started.
    pub fn spawn(name: &str, program: &Path, args: &[String], log_dir: &Path) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new("setpriv")
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self { name: name.to_owned(), child: Some(child), log })
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The process ID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fails when the process has exited, quoting the end of its log.
    ///
    /// # Errors
    /// [`Exited`] when the process is no longer running.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(child) = &mut self.child
            && let Some(status) = child.try_wait()?
        {
            return Err(Exited { name: self.name.clone(), status, tail: self.tail(40) }.into());
        }
        Ok(())
    }

    /// The last `lines` lines of the log.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Sends `signal` (a name such as `STOP` or `CONT`) to the process.
    ///
    /// # Errors
    /// When the process has been stopped already or `kill` refuses.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid().with_context(|| format!("{} is not running", self.name))?;
        let status = Command::new("kill").arg("-s").arg(signal).arg(pid.to_string()).status().context("running kill")?;
        anyhow::ensure!(status.success(), "kill -s {signal} {pid} ({}) failed", self.name);
        Ok(())
    }

    /// Kills the process and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.wait();
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- {} log ({}) -----\n{}", self.name, self.log.display(), self.tail(60));
        }
        self.stop();
    }
}

/// A managed process that has exited: a state no retry can leave, so [`crate::eventually`] gives
/// up at once on an error that holds one rather than wait out its timeout.
#[derive(Debug)]
pub struct Exited {
    name: String,
    status: std::process::ExitStatus,
    tail: String,
}

impl std::fmt::Display for Exited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} exited with {}:\n{}", self.name, self.status, self.tail)
    }
}

impl std::error::Error for Exited {}

/// A loopback port that was free a moment ago and that this process has not handed out before.
///
/// The kernel may give a port it just released to the next `bind(0)`: two calls in a row once
/// gave Kueue the same port for its health and its metrics servers, and the manager shut down
/// half a second after it had answered as ready. Every port handed out is therefore remembered.
/// And `bind(0)` hands out ports from the ephemeral range, which the kernel also gives to
/// outgoing connections (every kubectl's, the API server's to etcd): one of them could take the
/// port before the component that was told it binds it. Ports are therefore chosen below that
/// range where there is room.
///
/// # Errors
/// When no port can be bound, or every one tried was handed out already.
pub fn free_port() -> anyhow::Result<u16> {
    static POOL: Mutex<Option<PortPool>> = Mutex::new(None);
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    pool.get_or_insert_with(PortPool::new).take()
}

/// The ports handed out, and where new ones are looked for.
struct PortPool {
    handed_out: BTreeSet<u16>,
    /// Ports below the kernel's ephemeral range; empty where that range leaves no room.
    below_ephemeral: std::ops::Range<u16>,
    /// xorshift state: where in the range to try next.
    seed: u64,
}

impl PortPool {
    /// The lowest port looked at: below it are the well-known and registered services' ports.
    const LOWEST: u16 = 10_000;

    fn new() -> Self {
        let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32_768);
        let below_ephemeral = Self::LOWEST..ephemeral_start.max(Self::LOWEST);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        // Test binaries run one after another; each starts somewhere else in the range.
        let seed = (nanos as u64 ^ u64::from(std::process::id()).rotate_left(32)) | 1;
        Self { handed_out: BTreeSet::new(), below_ephemeral, seed }
    }

    fn take(&mut self) -> anyhow::Result<u16> {
        let range = self.below_ephemeral.clone();
        let width = u64::from(range.end - range.start);
        if width >= 1_000 {
            for _ in 0..256 {
                self.seed ^= self.seed << 13;
                self.seed ^= self.seed >> 7;
                self.seed ^= self.seed << 17;
                let port = range.start + u16::try_from(self.seed % width).expect("below the range's width");
                if !self.handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                    self.handed_out.insert(port);
                    return Ok(port);
                }
            }
        }
        // No room below the ephemeral range, or none of it free: what the kernel offers. Refused
        // ones are held until a new port turns up, so that it offers another each time.
        let mut refused = Vec::new();
        for _ in 0..64 {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let port = listener.local_addr()?.port();
            if self.handed_out.insert(port) {
                return Ok(port);
            }
            refused.push(listener);
        }
        anyhow::bail!("the kernel offered only loopback ports this process had handed out already ({} tries)", refused.len())
    }
}

/// A plain HTTP/1.1 GET on loopback `port`: the status line, headers and body.
///
/// # Errors
/// When nothing answers on the port.
pub fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_port_is_handed_out_twice_even_by_callers_on_other_threads() {
        let threads: Vec<_> =
            (0..4).map(|_| std::thread::spawn(|| (0..100).map(|_| free_port().unwrap()).collect::<Vec<_>>())).collect();
        let ports: Vec<u16> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        // Each was free: a listener can bind it now.
        for port in ports.iter().take(20) {
            TcpListener::bind(("127.0.0.1", *port)).unwrap();
        }
    }

    #[test]
    fn ports_come_from_below_the_range_outgoing_connections_take_theirs_from() {
        let mut pool = PortPool::new();
        if pool.below_ephemeral.len() < 1_000 {
            eprintln!("this machine's ephemeral range leaves no room below it; nothing to check");
            return;
        }
        let ports: Vec<u16> = (0..200).map(|_| pool.take().unwrap()).collect();
        assert!(ports.iter().all(|p| pool.below_ephemeral.contains(p)), "{ports:?} not all in {:?}", pool.below_ephemeral);
        // Spread over the range, not counted up from one end.
        let (low, high) = (ports.iter().min().unwrap(), ports.iter().max().unwrap());
        assert!(high - low > 1_000, "{low}..{high}");
    }
}
