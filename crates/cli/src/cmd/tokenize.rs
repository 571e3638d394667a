//! `titan tokenize`: the token ids of a text, as a JSON array.

use std::path::PathBuf;

use anyhow::Result;
use titan_gguf::GgufFile;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    text: String,
    /// Do not add BOS/EOS even if the vocabulary asks for them.
    #[arg(long)]
    no_special: bool,
    /// Match special-token text (like "<|im_end|>") as those tokens.
    #[arg(long)]
    parse_special: bool,
}

pub fn run(a: Args) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let tok = titan_engine::vocab::tokenizer_from_gguf(&f)?;
    let ids = tok.encode(&a.text, !a.no_special, a.parse_special);
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
