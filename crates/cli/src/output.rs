//! How the command line talks: progress bars, byte counts, errors on one line, and the log.
//!
//! Results and progress are plain text on stdout and stderr. Everything the libraries log goes through
//! `tracing`: for a command that runs and ends, as plain lines (`warning: …`); for the long-running
//! `serve` and `worker`, with a timestamp, the level and the span (the request, the exchange) each line
//! belongs to. `--log-level` (or `RUST_LOG`, which takes tracing's filter syntax) chooses how much.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

pub use titan_store::human_bytes as human;

pub fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// The error and its causes on one line, each cause once: many errors already quote their source in
/// their own message (`path: No such file…`), and repeating it would only add noise.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if !line.contains(&cause) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&cause);
        }
    }
    line
}

/// Sends the libraries' log to stderr: `level` (`error`, `warn`, `info`, `debug`, `trace`), unless
/// `RUST_LOG` says more precisely what; `service` for a long-running process.
pub fn start_log(level: &str, service: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    // A second start (tests that run several commands in one process) keeps the first.
    let _ = if service {
        builder.with_target(false).try_init()
    } else {
        builder.event_format(Plain).try_init()
    };
}

/// A line as the rest of the command line writes them: the message, prefixed by its level unless it is
/// plain information.
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let prefix = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG => "debug: ",
            Level::TRACE => "trace: ",
        };
        write!(w, "{prefix}")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// What speculative decoding did in a generation, in one line.
pub fn speculation(g: &titan_engine::Generation) -> String {
    format!(
        "speculation: {:.2} tokens per step, {} of {} drafts accepted ({:.0}%)",
        g.tokens.len() as f64 / g.spec.steps.max(1) as f64,
        g.spec.accepted,
        g.spec.drafted,
        100.0 * g.spec.acceptance()
    )
}
