//! `nereus inspect config|topology`: what the job would run with, and where every rank sits.

use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;

use nereus_core::config::provenance::{annotated_toml, Provenance};
use nereus_core::config::{ConfigSource, JobConfig, Overrides, EMBEDDED_DEFAULT_NAME};

use super::OverrideArgs;
use crate::error::CommandError;
use crate::launch::{planner_command, Global};

/// `nereus inspect …`.
#[derive(Subcommand, Debug, Clone)]
pub enum InspectCommand {
    /// Validate a job config on every rank and print it resolved (CLI > TOML > defaults).
    Config(ConfigArgs),
    /// Print nodes, packages, NUMA domains, cores, GPUs and each rank's binding and device.
    Topology {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `nereus inspect config`.
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Job file (TOML); the embedded default (configs/tiny-ppo.toml) when omitted.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub overrides: OverrideArgs,
}

/// Runs `nereus inspect …`.
pub fn exec(command: InspectCommand, global: &Global) -> u8 {
    match command {
        InspectCommand::Config(args) => {
            let name =
                args.file.as_ref().map_or_else(|| EMBEDDED_DEFAULT_NAME.to_string(), |p| p.display().to_string());
            let overrides: Overrides = args.overrides.into();
            let (file, layers) = (args.file.clone(), overrides.clone());
            planner_command(global, args.file.as_deref(), &overrides, |config, ranks| {
                // The file parsed once already; the sources are read back from the same layers.
                let source = ConfigSource::file_or_default(file.as_deref()).map_err(CommandError::from)?;
                let provenance = Provenance::of(config, &source, &layers);
                print_config(config, &name, &provenance, ranks)
            })
        }
        #[cfg(feature = "mpi")]
        InspectCommand::Topology { json } => {
            crate::launch::spmd(global, |session| nereus_runtime::inspect::topology(session, json))
        }
        #[cfg(not(feature = "mpi"))]
        InspectCommand::Topology { .. } => crate::launch::needs_mpi("inspect topology"),
    }
}

/// Rank 0 prints the config resolved, each value with its source, the config's hash and the
/// ranks that agreed on it.
fn print_config(config: &JobConfig, source: &str, provenance: &Provenance, ranks: i32) -> Result<(), CommandError> {
    let mut out = std::io::stdout().lock();
    let (backends, note) = backends(config);
    let mut text = format!("# resolved job config from {source}\n");
    text += &format!("# config hash {:016x}, agreed by {ranks} rank(s)\n", config.hash());
    text += &format!(
        "# {} devices ({} nodes x {}), backends in this binary: {backends}\n",
        config.cluster.devices(),
        config.cluster.nodes,
        config.cluster.devices_per_node,
    );
    if let Some(note) = note {
        text += &format!("# note: {note}\n");
    }
    text += &annotated_toml(config, provenance);
    out.write_all(text.as_bytes()).map_err(CommandError::Stdout)
}

/// The device backends compiled in, and why the config's data plane cannot run here (if not).
#[cfg(feature = "mpi")]
fn backends(config: &JobConfig) -> (String, Option<String>) {
    use nereus_exec::backend;
    let note = backend::check_data_plane(config.cluster.data_plane).err().map(|e| e.to_string());
    (backend::compiled_backends().to_string(), note)
}

/// A planner-only binary has none: it plans for any data plane and runs none.
#[cfg(not(feature = "mpi"))]
fn backends(_: &JobConfig) -> (String, Option<String>) {
    ("none (a planner-only build without the `mpi` feature)".into(), None)
}
