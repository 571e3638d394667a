//! `titan verify`: every record of an expert store against its digest, and optionally against the model.

use std::path::PathBuf;

use anyhow::{bail, Result};
use titan_store::{Layout, Store, StoreOptions};

use crate::output::{human, progress_bar};

#[derive(clap::Args)]
pub struct Args {
    /// The store: a directory written by `titan convert`, or an in-place index file.
    store: PathBuf,
    /// Also check that every expert's bytes in this model are the ones the store holds.
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let (store, model) = match &a.model {
        Some(m) => {
            let gguf = titan_gguf::GgufFile::open(m)?;
            (Store::open(&a.store, &gguf)?, Some(gguf))
        }
        None => (Store::open_unchecked(&a.store, &StoreOptions::default())?, None),
    };
    let whence = match store.layout() {
        Layout::Copy => String::new(),
        Layout::InPlace => format!(" in place in {}", store.file_path().display()),
    };
    let bar = progress_bar(0, "verifying");
    let r = store.verify(&mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    for e in &r.bad {
        eprintln!("error: {e}");
    }
    if !r.is_ok() {
        bail!(
            "{}: {} of {} records failed verification",
            a.store.display(),
            r.bad.len(),
            r.records
        );
    }
    if let Some(gguf) = &model {
        let bad = store.source_mismatches(gguf, true)?;
        if let Some((layer, expert)) = bad.first() {
            bail!(
                "{} was not made from {}: {} experts differ, the first expert {expert} of layer {layer}",
                a.store.display(),
                gguf.path().display(),
                bad.len()
            );
        }
        println!(
            "OK: {} records, {} verified{whence}, every expert equal to {}'s",
            r.records,
            human(r.bytes),
            gguf.path().display()
        );
        return Ok(());
    }
    println!("OK: {} records, {} verified{whence}", r.records, human(r.bytes));
    Ok(())
}
