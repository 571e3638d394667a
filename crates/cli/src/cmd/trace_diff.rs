//! `titan trace-diff`: two traces compared: IDENTICAL, or the first divergence and the first differing decision.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    a: PathBuf,
    b: PathBuf,
    /// Compare values within this absolute tolerance instead of bit for bit.
    #[arg(long)]
    tolerance: Option<f32>,
}

/// Exit code: 0 identical, 1 different, 2 unreadable input.
pub fn run(a: Args) -> i32 {
    use titan_engine::trace::{diff, Trace};
    let (ta, tb) = match (Trace::read(&a.a), Trace::read(&a.b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if ta.model != tb.model {
        println!(
            "note: the traces come from different model files ({} vs {})",
            ta.model, tb.model
        );
    }
    let r = diff(&ta, &tb, a.tolerance);
    let counts = format!(
        "{} tensors, {} elements, {} decisions",
        r.tensors, r.elements, r.decisions
    );
    if r.identical() {
        let how = a.tolerance.map(|t| format!(" (within {t:e})")).unwrap_or_default();
        println!("IDENTICAL{how}: {counts}");
        return 0;
    }
    println!("DIFFERENT ({counts} compared)");
    if let Some(s) = &r.structural {
        println!("structure: {s}");
    }
    if let Some(d) = &r.first_tensor {
        println!(
            "first divergence: {} ({}): {} of {} elements differ, max |Δ| {:e}, max {} ULP",
            d.name,
            describe(&d.name),
            d.differing,
            d.elements,
            d.max_abs,
            d.max_ulp
        );
    }
    match &r.first_decision {
        Some(dec) => println!("first differing decision: {dec}"),
        None => println!("decisions: all {} identical", r.decisions),
    }
    1
}

fn describe(name: &str) -> String {
    let mut parts = Vec::new();
    for p in name.split('.') {
        match (p.strip_prefix('s'), p.strip_prefix('l')) {
            (Some(n), _) if n.parse::<u64>().is_ok() => parts.push(format!("step {}", n.parse::<u64>().unwrap())),
            (_, Some(n)) if n.parse::<u64>().is_ok() => parts.push(format!("layer {}", n.parse::<u64>().unwrap())),
            _ => parts.push(p.to_string()),
        }
    }
    parts.join(", ")
}
