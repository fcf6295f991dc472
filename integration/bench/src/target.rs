//! The plugin under test: any DRA kubelet plugin, given as a command line and a socket path
//! with placeholders, started once per simulated node.

use std::path::{Path, PathBuf};

use vgpu_dra_integration::{ControlPlane, ManagedProcess};

/// How to run the plugin for one node. Placeholders: `{node}`, `{dir}` (a fresh directory
/// standing in for the node's host paths), `{kubeconfig}`, `{driver}`.
#[derive(Debug, Clone)]
pub struct Target {
    /// The DRA driver name the plugin publishes under.
    pub driver: String,
    /// The command line (run by bash).
    pub command: String,
    /// The plugin's DRA service socket.
    pub socket: String,
    /// Where the nodes' directories are made; `None`: in the control plane's directory.
    pub node_root: Option<PathBuf>,
}

/// A plugin running for one node.
pub struct Running {
    /// The node it serves.
    pub node: String,
    /// Its process (the command `exec`s, so this is the plugin itself).
    pub process: ManagedProcess,
    /// Its DRA service socket.
    pub socket: PathBuf,
}

impl Target {
    fn expand(&self, template: &str, node: &str, dir: &Path, kubeconfig: &Path) -> String {
        template
            .replace("{node}", node)
            .replace("{dir}", &dir.display().to_string())
            .replace("{kubeconfig}", &kubeconfig.display().to_string())
            .replace("{driver}", &self.driver)
    }

    /// Starts the plugin for `node` with `kubeconfig`, its files under the node root or the
    /// plane's directory.
    pub fn start(&self, plane: &ControlPlane, kubeconfig: &Path, node: &str) -> anyhow::Result<Running> {
        let dir = match &self.node_root {
            // One plane's nodes apart from another's, by the random end of the plane's directory
            // name: the kubelet's socket paths must stay under 108 bytes.
            Some(root) => {
                let plane_name = plane.dir().file_name().unwrap_or_default().to_string_lossy().into_owned();
                let tag = plane_name.rsplit('-').next().unwrap_or_default();
                root.join(format!("{tag}-{node}"))
            }
            None => plane.dir().join(format!("bench-{node}")),
        };
        std::fs::create_dir_all(dir.join("kubelet/plugins_registry"))?;
        let command = self.expand(&self.command, node, &dir, kubeconfig);
        let socket = PathBuf::from(self.expand(&self.socket, node, &dir, kubeconfig));
        let process = ManagedProcess::spawn(
            &format!("plugin-{node}"),
            Path::new("bash"),
            &["-c".into(), format!("exec {command}")],
            plane.dir(),
        )?;
        Ok(Running { node: node.to_owned(), process, socket })
    }
}
