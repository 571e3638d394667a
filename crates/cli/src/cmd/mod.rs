//! One module per command: its arguments, and a `run` that calls the libraries and prints.

pub mod bench;
pub mod convert;
pub mod demo;
pub mod inspect;
pub mod logits;
pub mod perplexity;
pub mod profile;
pub mod run;
pub mod serve;
pub mod slice;
pub mod synth;
pub mod tokenize;
pub mod trace;
pub mod trace_diff;
pub mod verify;
pub mod worker;
