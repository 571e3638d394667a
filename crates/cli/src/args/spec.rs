//! Speculative decoding as the command line asks for it: where drafts come from, and how many.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use titan_engine::draft::{Drafter, ModelDrafter, MtpDrafter, NgramDrafter};
use titan_engine::{Model, Speculation};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// Prompt lookup: the tokens that followed the text's last few tokens where they occurred before.
    Ngram,
    /// The model's own multi-token-prediction block (Qwen3-Next and Qwen3.5/3.6 MoE files that kept it).
    Mtp,
    /// A smaller model with the same vocabulary (--draft).
    Draft,
    /// One token per step.
    Off,
}

#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: verify drafted tokens as rows of one step. The output is byte for byte the
    /// output without it; only the number of steps changes. Default: draft with --draft, else ngram.
    #[arg(long, value_enum)]
    pub spec: Option<SpecKind>,
    /// The draft model for --spec draft (a GGUF with the model's vocabulary).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// The most tokens drafted per step: the length is chosen below it from the recent acceptance and
    /// the measured cost of a step's rows.
    #[arg(long = "draft-max", default_value_t = 8)]
    pub draft_max: usize,
    /// The fewest tokens drafted per step, when the drafter has them (--draft-min N --draft-max N: always N).
    #[arg(long = "draft-min", default_value_t = 0)]
    pub draft_min: usize,
}

/// A drafter the command holds for the length of a generation (and the draft model it reads).
pub enum Drafts {
    Off,
    Ngram(NgramDrafter),
    Mtp,
    Model(Box<Model>),
}

impl SpecArgs {
    pub fn kind(&self) -> SpecKind {
        match (self.spec, &self.draft) {
            (Some(k), _) => k,
            (None, Some(_)) => SpecKind::Draft,
            (None, None) => SpecKind::Ngram,
        }
    }

    /// Loads what the chosen drafts need (the draft model, resident).
    pub fn load(&self) -> Result<Drafts> {
        Ok(match self.kind() {
            SpecKind::Off => Drafts::Off,
            SpecKind::Ngram => Drafts::Ngram(NgramDrafter::default()),
            SpecKind::Mtp => Drafts::Mtp,
            SpecKind::Draft => {
                let path = self
                    .draft
                    .as_ref()
                    .context("--spec draft needs a draft model: --draft MODEL.gguf")?;
                Drafts::Model(Box::new(
                    Model::load(path).with_context(|| format!("--draft {}", path.display()))?,
                ))
            }
        })
    }
}

impl Drafts {
    /// The drafter for one generation of `model` over `n_ctx` positions, or none.
    pub fn drafter<'d>(&'d mut self, model: &'d Model, n_ctx: usize) -> Result<Option<Box<dyn Drafter + 'd>>> {
        Ok(match self {
            Drafts::Off => None,
            Drafts::Ngram(n) => Some(Box::new(n.clone())),
            Drafts::Mtp => Some(Box::new(MtpDrafter::new(model, n_ctx).context("--spec mtp")?)),
            Drafts::Model(m) => Some(Box::new(ModelDrafter::new(m, model, n_ctx).context("--draft")?)),
        })
    }
}

impl SpecArgs {
    /// `drafter` as the engine takes it, with these options' lengths.
    pub fn speculation<'a>(&self, drafter: &'a mut Option<Box<dyn Drafter + '_>>) -> Option<Speculation<'a>> {
        drafter.as_deref_mut().map(|d| Speculation {
            drafter: d,
            min_drafts: self.draft_min,
            max_drafts: self.draft_max,
        })
    }
}
