//! `titan convert`: a model's expert store — an index of its experts inside the model, or a copy of them.

use std::path::PathBuf;

use anyhow::Result;
use clap::ValueEnum;
use titan_gguf::GgufFile;
use titan_store::plan::default_store;
use titan_store::{convert, write_index, ConvertOptions, Layout};

use crate::output::{human, progress_bar};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model (never modified).
    model: PathBuf,
    /// The store to write (default beside the model: MODEL.titan for a copy, MODEL.titan-index for an
    /// in-place index).
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    /// in-place: an index of the experts inside the model (three reads per expert, no second copy).
    /// copy: every expert copied into an aligned record (one read per expert, twice the disk; measured
    /// no faster, see docs/benchmarks.md).
    #[arg(long, value_enum, default_value = "in-place")]
    layout: LayoutArg,
    /// Record alignment in bytes (a power of two, at least 512; the copy layout only).
    #[arg(long, default_value_t = titan_store::DEFAULT_ALIGNMENT)]
    alignment: u64,
    /// Replace an existing store.
    #[arg(long)]
    force: bool,
}

pub fn run(a: Args) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let layout = a.layout.into();
    let out = a.output.clone().unwrap_or_else(|| default_store(&a.model, layout));
    let bar = progress_bar(
        0,
        if layout == Layout::Copy {
            "converting"
        } else {
            "indexing"
        },
    );
    let mut progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    match layout {
        Layout::Copy => {
            let m = convert(
                &f,
                &out,
                &ConvertOptions {
                    alignment: a.alignment,
                    force: a.force,
                },
                &mut progress,
            )?;
            bar.finish_and_clear();
            let bytes: u64 = m.records.iter().map(|r| r.length).sum();
            eprintln!(
                "wrote {} ({} expert records, {}) from {}",
                out.display(),
                m.records.len(),
                human(bytes),
                a.model.display()
            );
        }
        Layout::InPlace => {
            let index = write_index(&f, &out, a.force, &mut progress)?;
            bar.finish_and_clear();
            let bytes: u64 = index
                .layers
                .iter()
                .map(|l| l.record_length() * index.n_expert as u64)
                .sum();
            let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
            eprintln!(
                "wrote {} ({}: where {} experts, {}, are in {}, and their digests; no copy)",
                out.display(),
                human(size),
                index.digests.len(),
                human(bytes),
                a.model.display()
            );
        }
    }
    Ok(())
}

/// `--layout`.
#[derive(ValueEnum, Clone, Copy, Default)]
enum LayoutArg {
    Copy,
    #[default]
    InPlace,
}

impl From<LayoutArg> for Layout {
    fn from(a: LayoutArg) -> Layout {
        match a {
            LayoutArg::Copy => Layout::Copy,
            LayoutArg::InPlace => Layout::InPlace,
        }
    }
}
