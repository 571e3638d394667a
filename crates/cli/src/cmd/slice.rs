//! `titan slice`: a shard — the experts of some layers and expert ids — as a GGUF a worker can serve.

use std::path::PathBuf;

use anyhow::Result;
use titan_gguf::GgufFile;

use crate::output::{human, progress_bar};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model (never modified).
    model: PathBuf,
    /// Layers to keep, e.g. 0-47.
    #[arg(long)]
    layers: String,
    /// Expert ids to keep, e.g. 0-42.
    #[arg(long)]
    experts: String,
    #[arg(short = 'o', long)]
    output: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    use titan_cluster::slice::{parse_range, write_shard, SliceSpec};
    // Checked before the model is even opened: the shard is renamed over the output, so an output that is
    // the model (under any name) would replace it.
    titan_store::check_output(&a.output, &[&a.model], titan_store::OutputKind::File)?;
    let f = std::sync::Arc::new(GgufFile::open(&a.model)?);
    let spec = SliceSpec {
        layers: parse_range(&a.layers)?,
        experts: parse_range(&a.experts)?,
    };
    let bar = progress_bar(0, "slicing");
    let bytes = write_shard(&f, &spec, &a.output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({}: layers {}, experts {} of {})",
        a.output.display(),
        human(bytes),
        a.layers,
        a.experts,
        a.model.display()
    );
    Ok(())
}
