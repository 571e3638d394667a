//! Continuous batching: the engine loop. Requests wait in a bounded queue; between steps the loop admits
//! as many as there are free slots, and each step carries every decoding sequence's next row plus prompt
//! chunks of the sequences still reading their prompt, up to a token budget. A sequence leaves its slot
//! the step it finishes, or as soon as its client has gone.
//!
//! The loop runs on its own thread and owns the model's sequences; the HTTP side only sends [`Job`]s and
//! reads [`Event`]s. A sequence's tokens do not depend on what it is batched with (`forward_batch`'s
//! contract), so a greedy request returns the same text alone or beside others. A freed slot keeps its
//! sequence's cache for the next request that shares a prefix with it (`prompt_cache.rs`).
//!
//! With speculation on, a decoding sequence's row is followed by drafted tokens (prompt lookup over its own
//! text, a draft model, or the model's own MTP block) as rows of the same step; it keeps each draft that equals the token it samples there, so a
//! request's bytes are those it would get without drafts (docs/speculative.md). A recurrent state takes a
//! second copy before such a step, beside the prompt cache's (`Sequence::checkpoint_step`).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use titan_engine::draft::{DraftLength, Drafter, ModelDrafter, MtpDrafter, NgramDrafter, StepRows};
use titan_engine::sampler::TokenLogprobs;
use titan_engine::{Batch, Model, Outputs, Sampler, SamplerOptions, Span};
use titan_tokenizer::StreamDecoder;
use tokio::sync::mpsc;

use crate::constraint::Constraint;
use crate::metrics::Metrics;
use crate::prompt_cache::{PromptCache, SlotCache};

/// One request, as the engine runs it.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampler: SamplerOptions,
    pub max_tokens: usize,
    /// Generation ends before the first occurrence of any of these (not included in the text).
    pub stop: Vec<String>,
    pub logprobs: bool,
    /// With `logprobs`, how many of the most likely tokens to give beside the chosen one.
    pub top_logprobs: usize,
    /// The grammar the output follows (structured output): only the tokens it allows are drawn, and the
    /// request ends where it is complete.
    pub constraint: Option<Constraint>,
    /// Render control tokens as their names (`<|channel|>`), as llama-server renders a tool format's
    /// markers: the answer is parsed for calls in a syntax whose markers may be control tokens.
    pub special: bool,
    pub events: mpsc::UnboundedSender<Event>,
    pub queued_at: Instant,
    /// The HTTP request's span: the engine's lines about the request carry its id.
    pub span: tracing::Span,
}

#[derive(Debug)]
pub enum Event {
    /// Newly decoded text (possibly empty, while a multi-byte character is incomplete or a stop string
    /// might be starting), with the token's log-probabilities when asked for.
    Text {
        text: String,
        logprob: Option<TokenLogprobs>,
    },
    Done {
        finish: Finish,
        usage: Usage,
    },
    Failed(String),
}

/// The tokens of a request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt: usize,
    /// Of the prompt's tokens, those whose cache a slot held already (OpenAI's `cached_tokens`).
    pub cached: usize,
    pub completion: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

pub struct SchedulerOptions {
    /// Sequences served at once.
    pub parallel: usize,
    /// KV cache positions of each sequence.
    pub ctx_size: usize,
    /// Most tokens one step carries (decode rows first, then prompt chunks).
    pub step_tokens: usize,
    /// Reuse the longest prefix of a prompt that a free slot's cache holds.
    pub prompt_cache: bool,
    /// The fewest and the most tokens drafted after a decoding sequence's row; a most of 0: none.
    pub min_drafts: usize,
    pub max_drafts: usize,
    /// Where the drafts come from.
    pub drafts: DraftSource,
}

pub enum DraftSource {
    /// Prompt lookup over each sequence's own text.
    Lookup,
    /// A draft model with the model's vocabulary, drafting for every slot (each with its own sequence of
    /// it).
    Model(Arc<Model>),
    /// The model's own MTP block, whose cache each slot keeps with its sequence.
    Mtp,
}

/// A request in a slot: its sequence, what it has generated, and what it has sent.
struct Slot<'m> {
    job: Job,
    /// The sequence, and the MTP drafter that follows it when the drafts are the MTP block's.
    cache: SlotCache<'m>,
    sampler: Sampler,
    /// The prompt, then each generated token.
    history: Vec<u32>,
    /// Positions of `history` already in the sequence's cache.
    in_cache: usize,
    /// Of those, the ones the slot's cache held when the request came.
    cached: usize,
    generated: usize,
    decoder: StreamDecoder<'m>,
    /// Decoded text held back because it may be the start of a stop string.
    held: String,
    first_token: bool,
    /// This step's rows: the tokens not yet in the cache, then `drafts`.
    fed: Vec<u32>,
    drafts: Vec<u32>,
    length: DraftLength,
    /// The slot's draft model, when the server has one (else prompt lookup, or the MTP block).
    drafter: Option<ModelDrafter<'m>>,
}

impl Slot<'_> {
    fn reading_prompt(&self) -> bool {
        self.in_cache < self.job.prompt.len()
    }
}

/// Runs until every sender of `queue` is gone.
pub fn run(model: &Model, opts: &SchedulerOptions, mut queue: mpsc::Receiver<Job>, metrics: &Metrics) {
    let mut slots: Vec<Slot<'_>> = Vec::new();
    let mut free = PromptCache::new(opts.prompt_cache);
    let mut batch = Batch::default();
    // The final states of the rows an MTP drafter is shown, kept from step to step.
    let mut states = Vec::new();
    loop {
        // Admit: block for work when idle; otherwise take what is waiting, up to the free slots.
        while slots.len() < opts.parallel {
            let job = if slots.is_empty() {
                match queue.blocking_recv() {
                    Some(j) => j,
                    None => return,
                }
            } else {
                match queue.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
            if job.events.is_closed() {
                job.span
                    .in_scope(|| tracing::info!("abandoned by the client while queued"));
                continue;
            }
            let drafter = match &opts.drafts {
                DraftSource::Model(d) => match ModelDrafter::new(d, model, opts.ctx_size) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        let _ = job.events.send(Event::Failed(e.to_string()));
                        continue;
                    }
                },
                DraftSource::Lookup | DraftSource::Mtp => None,
            };
            let unused = slots.len() + free.held() < opts.parallel;
            let fresh = || -> titan_engine::Result<SlotCache<'_>> {
                let mtp = matches!(opts.drafts, DraftSource::Mtp) && opts.max_drafts > 0;
                Ok(SlotCache {
                    seq: model.new_sequence(opts.ctx_size),
                    mtp: mtp.then(|| MtpDrafter::new(model, opts.ctx_size)).transpose()?,
                })
            };
            let (cache, cached) = match free.take(&job.prompt, unused, fresh) {
                Ok(c) => c,
                Err(e) => {
                    let _ = job.events.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            metrics.prompt_tokens_cached.fetch_add(cached as u64, Ordering::Relaxed);
            slots.push(Slot {
                cache,
                sampler: Sampler::new(job.sampler.clone()),
                history: job.prompt.clone(),
                in_cache: cached,
                cached,
                generated: 0,
                decoder: model.tokenizer.stream(),
                held: String::new(),
                first_token: true,
                fed: Vec::new(),
                drafts: Vec::new(),
                length: DraftLength::new(opts.min_drafts, opts.max_drafts),
                drafter,
                job,
            });
        }
        // A client that has gone frees its slot before the step, not after its request's end.
        for i in (0..slots.len()).rev() {
            if slots[i].job.events.is_closed() {
                let s = slots.remove(i);
                s.job.span.in_scope(|| {
                    tracing::info!(generated = s.generated, "abandoned by the client");
                });
                release(&mut free, s);
            }
        }
        metrics.active.store(slots.len() as u64, Ordering::Relaxed);
        if slots.is_empty() {
            continue;
        }
        step(model, opts, &mut slots, &mut free, &mut batch, &mut states, metrics);
        // Those the step finished are gone now, not at the next step, which may be a long wait away.
        metrics.active.store(slots.len() as u64, Ordering::Relaxed);
    }
}

/// A slot's sequence back to the free ones, with the tokens its cache holds.
fn release<'m>(free: &mut PromptCache<'m>, s: Slot<'m>) {
    let mut tokens = s.history;
    tokens.truncate(s.in_cache);
    free.put(s.cache, tokens);
}

/// One forward step over the slots, then each finished row sampled and sent; the slots it frees go to
/// `free`.
fn step<'m>(
    model: &'m Model,
    opts: &SchedulerOptions,
    slots: &mut Vec<Slot<'m>>,
    free: &mut PromptCache<'m>,
    batch: &mut Batch,
    states: &mut Vec<f32>,
    metrics: &Metrics,
) {
    // Decode rows first (latency matters): each decoding sequence's next token and its drafts. Then prompt
    // chunks in admission order.
    let started = Instant::now();
    let mut budget = opts.step_tokens.max(slots.len());
    let mut take = vec![0usize; slots.len()];
    for (t, s) in take
        .iter_mut()
        .zip(slots.iter_mut())
        .filter(|(_, s)| !s.reading_prompt())
    {
        // The tokens not yet in the cache: the last one chosen, and those kept since a recurrent state's
        // copy that a rejected draft sent it back to.
        let pending = s.history.len() - s.in_cache;
        // Rows for the tokens still wanted, and no position past the context.
        let room = (s.job.max_tokens - s.generated - 1).min(opts.ctx_size - s.history.len());
        let want = s.length.get().min(room).min(budget.saturating_sub(pending));
        let drafted = match (&opts.drafts, s.drafter.as_mut(), s.cache.mtp.as_mut()) {
            (_, Some(d), _) => d.draft(&s.history, want, &mut s.drafts),
            (_, None, Some(m)) => m.draft(&s.history, want, &mut s.drafts),
            (DraftSource::Lookup, None, None) => NgramDrafter::default().draft(&s.history, want, &mut s.drafts),
            // An MTP drafter that failed earlier drafts no more.
            _ => {
                s.drafts.clear();
                Ok(())
            }
        };
        if let Err(e) = drafted {
            // A drafter that fails costs its drafts, not the request: the step goes on without them.
            s.job.span.in_scope(|| tracing::warn!("drafting failed: {e}"));
            s.drafts.clear();
        }
        if !s.drafts.is_empty() {
            s.cache.seq.checkpoint_step();
        }
        s.fed.clear();
        s.fed.extend_from_slice(&s.history[s.in_cache..]);
        s.fed.extend_from_slice(&s.drafts);
        *t = s.fed.len();
        budget = budget.saturating_sub(*t);
    }
    for (t, s) in take
        .iter_mut()
        .zip(slots.iter_mut())
        .filter(|(_, s)| s.reading_prompt())
    {
        *t = (s.job.prompt.len() - s.in_cache).min(budget);
        budget -= *t;
        s.fed.clear();
        s.fed.extend_from_slice(&s.history[s.in_cache..s.in_cache + *t]);
    }
    let mut spans: Vec<Span<'_>> = Vec::new();
    let mut members = Vec::new();
    for (i, (s, &n)) in slots.iter_mut().zip(&take).enumerate() {
        if n == 0 {
            continue;
        }
        spans.push(Span {
            tokens: &s.fed,
            pos0: s.in_cache,
            seq: &mut s.cache.seq,
            outputs: if s.drafts.is_empty() {
                Outputs::Last
            } else {
                Outputs::All
            },
        });
        members.push(i);
    }
    let rows: usize = spans.iter().map(|s| s.tokens.len()).sum();
    let result = model.forward_batch(&mut spans, batch).map(|_| ());
    drop(spans);
    metrics.record_step(rows, members.len(), started.elapsed());
    match result {
        Ok(()) => {}
        Err(e) => {
            // The step failed for every member (a lost disk, a cluster with no way to compute a layer):
            // each is told, and their slots are freed.
            for &i in members.iter().rev() {
                let s = slots.remove(i);
                s.job.span.in_scope(|| tracing::error!("the engine step failed: {e}"));
                let _ = s.job.events.send(Event::Failed(e.to_string()));
                // What the step wrote of its cache is unknown: nothing of it is reused.
                free.put(s.cache, Vec::new());
            }
            return;
        }
    }
    let logits = batch.logits();
    let v = model.config.n_vocab;
    let seconds = started.elapsed().as_secs_f64();
    let mut finished = Vec::new();
    let (mut row, mut first_row) = (0, 0);
    for &i in &members {
        let s = &mut slots[i];
        let was_reading = s.reading_prompt();
        // This member's rows of logits: one for each of its rows with drafts, else its last.
        let rows = if s.drafts.is_empty() { 1 } else { take[i] };
        let logits = &logits[row * v..(row + rows) * v];
        row += rows;
        let before = s.history.len();
        let pos0 = s.in_cache;
        s.in_cache += take[i] - s.drafts.len();
        let step_rows = first_row..first_row + take[i];
        first_row += take[i];
        if s.reading_prompt() {
            follow(model, batch, s, pos0, step_rows, states);
            continue;
        }
        if was_reading && opts.prompt_cache {
            // The one position a recurrent state can come back to (a KV cache needs no copy): the next
            // turn of a conversation repeats this prompt, whatever it makes of the answer.
            s.cache.seq.checkpoint();
        }
        // Sample row after row while the token sampled is the draft the next row was computed for.
        let mut outcome = Ok(None);
        let mut accepted = 0;
        for (j, row_logits) in logits[(rows - 1 - s.drafts.len()) * v..].chunks_exact(v).enumerate() {
            outcome = advance(model, opts, s, row_logits, metrics);
            let kept = s.history.len() > before + j && s.drafts.get(j) == s.history.last();
            if !matches!(outcome, Ok(None)) || !kept {
                break;
            }
            accepted += 1;
        }
        follow(model, batch, s, pos0, step_rows, states);
        if let Some(m) = s.cache.mtp.as_mut().filter(|_| was_reading && opts.prompt_cache) {
            // Where the sequence's checkpoint is: a later request that shares the prompt continues there.
            m.mark();
        }
        if !s.drafts.is_empty() {
            // The rows of rejected drafts hold other tokens than the text's: cut them (a recurrent state goes
            // back to its copy from before the step, and the next step feeds the kept tokens again).
            s.in_cache = s.cache.seq.reusable(s.in_cache + accepted);
            if let Err(e) = s.cache.seq.truncate(s.in_cache) {
                outcome = Err(e.to_string());
            }
            metrics.record_drafts(s.drafts.len(), accepted);
        }
        s.length.update(take[i], s.drafts.len(), accepted, seconds);
        let finish = match outcome {
            Ok(f) => f,
            Err(why) => {
                // Only a grammar fails here; the sequence's cache is sound and is kept.
                s.job.span.in_scope(|| tracing::error!("{why}"));
                let _ = s.job.events.send(Event::Failed(why));
                finished.push(i);
                continue;
            }
        };
        if let Some(finish) = finish {
            s.job.span.in_scope(|| {
                tracing::info!(
                    finish = %finish.as_str(),
                    prompt_tokens = s.job.prompt.len(),
                    cached_tokens = s.cached,
                    generated = s.generated,
                    ms = %crate::ms(s.job.queued_at.elapsed()),
                    "generated"
                );
            });
            let usage = Usage {
                prompt: s.job.prompt.len(),
                cached: s.cached,
                completion: s.generated,
            };
            let _ = s.job.events.send(Event::Done { finish, usage });
            finished.push(i);
        }
    }
    for &i in finished.iter().rev() {
        release(free, slots.remove(i));
        metrics.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Shows the slot's MTP drafter the rows `rows` of the step (its text's positions `pos0`..) that the text
/// keeps: those whose token is the history's at their position, not a rejected draft's.
fn follow(model: &Model, batch: &Batch, s: &mut Slot<'_>, pos0: usize, rows: Range<usize>, states: &mut Vec<f32>) {
    let Some(m) = s.cache.mtp.as_mut() else {
        return;
    };
    let kept = s
        .fed
        .iter()
        .zip(&s.history[pos0..])
        .take_while(|(a, b)| a == b)
        .count()
        .min(rows.len());
    states.clear();
    model.batch_final_states(batch, rows.start..rows.start + kept, states);
    let step = StepRows {
        tokens: &s.fed[..kept],
        pos0,
        states,
    };
    if let Err(e) = m.observe(&step) {
        // Drafts are only ever proposals: the request goes on without them.
        s.job
            .span
            .in_scope(|| tracing::warn!("the MTP drafter failed, this slot drafts no more: {e}"));
        s.cache.mtp = None;
    }
}

/// Samples the slot's next token from `logits` and sends its text; the finish reason if the request is done,
/// or why its grammar cannot go on.
fn advance<'m>(
    model: &'m Model,
    opts: &SchedulerOptions,
    s: &mut Slot<'m>,
    logits: &[f32],
    metrics: &Metrics,
) -> Result<Option<Finish>, String> {
    let token = match s.job.constraint.as_mut() {
        None => s.sampler.sample(logits, &s.history),
        Some(c) => {
            let broken = |e| format!("the response format cannot be followed: {e}");
            let token = s
                .sampler
                .sample_allowed(logits, &s.history, c.allowed().map_err(broken)?);
            if !c.allows(token).map_err(broken)? {
                return Err("logit_bias bans every token the response format allows here".into());
            }
            token
        }
    };
    if s.first_token {
        s.first_token = false;
        metrics.record_first_token(s.job.queued_at.elapsed());
    }
    if model.tokenizer.is_eog(token) {
        // (A grammar allows the end of generation only where it is complete.)
        flush(model, s);
        return Ok(Some(Finish::Stop));
    }
    if let Some(c) = s.job.constraint.as_mut() {
        c.accept(token)
            .map_err(|e| format!("the response format cannot be followed: {e}"))?;
    }
    s.generated += 1;
    s.history.push(token);
    metrics.generated.fetch_add(1, Ordering::Relaxed);
    let logprob = s
        .job
        .logprobs
        .then(|| titan_engine::sampler::logprobs(logits, token, s.job.top_logprobs));
    s.held.push_str(&s.decoder.push(token));
    // A control token has no bytes, so its name follows whatever the decoder gave out before it.
    if let Some(name) = s.job.special.then(|| model.tokenizer.special_text(token)).flatten() {
        s.held.push_str(name);
    }
    // A stop string ends the text where it begins; text that could still become one is held back.
    if let Some(at) = s.job.stop.iter().filter_map(|stop| s.held.find(stop.as_str())).min() {
        let text = s.held[..at].to_string();
        s.held.clear();
        send_text(s, text, logprob);
        return Ok(Some(Finish::Stop));
    }
    let keep = s
        .job
        .stop
        .iter()
        .map(|stop| partial_suffix(&s.held, stop))
        .max()
        .unwrap_or(0);
    let text = s.held[..s.held.len() - keep].to_string();
    s.held.drain(..s.held.len() - keep);
    send_text(s, text, logprob);
    // A complete structured output ends the request (before its length could), as the end of generation
    // would: nothing may follow it.
    if s.job.constraint.as_ref().is_some_and(Constraint::is_done) {
        flush(model, s);
        return Ok(Some(Finish::Stop));
    }
    if s.generated >= s.job.max_tokens || s.history.len() >= opts.ctx_size {
        flush(model, s);
        return Ok(Some(Finish::Length));
    }
    Ok(None)
}

/// Sends the text held back (a possible start of a stop string, an incomplete character) at the request's end.
fn flush<'m>(model: &'m Model, s: &mut Slot<'m>) {
    let rest = std::mem::take(&mut s.held) + &std::mem::replace(&mut s.decoder, model.tokenizer.stream()).finish();
    if !rest.is_empty() {
        send_text(s, rest, None);
    }
}

fn send_text(s: &Slot<'_>, text: String, logprob: Option<TokenLogprobs>) {
    let _ = s.job.events.send(Event::Text { text, logprob });
}

/// The length of the longest suffix of `text` that is a proper prefix of `stop` (on character boundaries).
fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// The queue the HTTP side sends jobs into, and the engine thread that drains it.
pub fn start(
    model: Arc<Model>,
    opts: SchedulerOptions,
    queue_len: usize,
    metrics: Arc<Metrics>,
) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel(queue_len.max(1));
    std::thread::Builder::new().name("engine".into()).spawn(move || {
        // Inside the global pool, as the CLI's commands run: the forward pass's parallel regions are
        // then pushes onto this worker's own queue.
        rayon::scope(|_| run(&model, &opts, rx, &metrics));
    })?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_back_text_is_the_longest_start_of_a_stop_string() {
        assert_eq!(partial_suffix("Hello wor", "world"), 3);
        assert_eq!(partial_suffix("Hello", "world"), 0);
        assert_eq!(partial_suffix("ab", "abc"), 2);
        assert_eq!(partial_suffix("xé", "éa"), "é".len());
        assert_eq!(partial_suffix("", "abc"), 0);
    }
}
