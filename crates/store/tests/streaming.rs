//! Experts streamed from an expert store (a copy, or an in-place index over the GGUF) through a bounded
//! cache give the same bytes as the fully resident model, for every budget down to one expert per layer,
//! with buffered and direct I/O.

use std::path::PathBuf;
use std::sync::Arc;

use titan_engine::samples::Sample;
use titan_engine::trace::{diff, Trace};
use titan_engine::{GenerateOptions, Model, Outputs, SamplerOptions};
use titan_gguf::GgufFile;
use titan_store::StreamedExperts;
use titan_store::{convert, load_model, write_index, ConvertOptions, ExpertCache, Policy, ReadMode, Store, StreamPlan};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The value of the unlabelled sample `name` the model's expert source reports.
fn sample(m: &Model, name: &str) -> f64 {
    let mut all: Vec<Sample> = Vec::new();
    m.experts.samples(&mut all);
    all.iter()
        .find(|s| s.name == name)
        .map(|s| s.value)
        .unwrap_or_else(|| panic!("no sample {name}"))
}

const FILES: &[&str] = &[
    "qwen3moe/q4_0.gguf",
    "qwen2moe/q8_0.gguf",
    "olmoe/f16.gguf",
    "mixtral/q4_1.gguf",
    "qwen3moe-k/q4_k_m.gguf",
    "qwen3next/q4_0.gguf",
    "qwen3next-mtp/q8_0.gguf", // an MTP block after the main ones: indexed with the rest, never asked for
    "qwen35moe-k/mxfp4_moe.gguf",
    "deepseek3/q4_0.gguf",
    "gpt-oss/mxfp4_moe.gguf",
    "glm4moe/q4_0.gguf",
    "minimax-m2/q8_0.gguf",
    "llama4/q4_0.gguf",
    "deepseek4/mxfp4_moe.gguf",
];

fn streamed(path: &std::path::Path, store: &std::path::Path, budget_bytes: u64, io: ReadMode, prefetch: bool) -> Model {
    let plan = StreamPlan {
        store: store.to_path_buf(),
        budget_bytes,
        policy: Policy::Lru,
        io,
        verify_digests: true,
        pinned: vec![],
        prefetch,
    };
    load_model(path, Some(&plan)).unwrap()
}

fn trace_of(model: &Model, prompt: &[u32]) -> Trace {
    let opts = GenerateOptions {
        max_tokens: 8,
        n_ctx: 64,
        sampler: SamplerOptions {
            temperature: 0.9,
            seed: 3,
            ..Default::default()
        },
    };
    let mut t = Trace::default();
    model.generate_traced(prompt, &opts, Some(&mut t), |_| {}).unwrap();
    t
}

#[test]
fn every_budget_and_io_mode_is_bit_identical_to_resident() {
    // Stores live beside the test binary, on the build disk (O_DIRECT needs a real filesystem).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for f in FILES {
        let path = fixtures().join(f);
        let store = dir.path().join(f.replace('/', "_")).with_extension("titan");
        convert(
            &GgufFile::open(&path).unwrap(),
            &store,
            &ConvertOptions::default(),
            &mut |_, _| {},
        )
        .unwrap();
        streams_as_resident(f, &store);
    }
}

/// The same with the in-place layout: the experts read out of the GGUF itself through its index, three
/// unaligned slices per expert rounded out to whole blocks, give the resident run's bytes.
#[test]
fn the_in_place_index_streams_bit_identical_to_resident() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for f in FILES {
        let path = fixtures().join(f);
        let index = dir.path().join(f.replace('/', "_")).with_extension("titan-index");
        write_index(&GgufFile::open(&path).unwrap(), &index, false, &mut |_, _| {}).unwrap();
        streams_as_resident(f, &index);
    }
}

/// Fixture `f` streamed from `store` (either layout) gives the resident logits and trace, bit for bit,
/// for every budget down to one expert per layer, buffered and with O_DIRECT.
fn streams_as_resident(f: &str, store: &std::path::Path) {
    let path = fixtures().join(f);
    let resident = Model::load(&path).unwrap();
    let tokens = resident
        .tokenizer
        .encode("Streaming experts from SSD: café 日本語 🙂", true, false);
    let mut seq = resident.new_sequence(tokens.len());
    let want = resident.forward(&tokens, 0, &mut seq, Outputs::All).unwrap();
    let want_trace = trace_of(&resident, &tokens);

    let s = Store::open(store, &resident.weights.file).unwrap();
    let (min, all) = (
        ExpertCache::min_budget(&s),
        s.records().len() as u64 * s.max_record_bytes(),
    );
    for budget in [1, min, all / 3, all] {
        for io in [ReadMode::Buffered, ReadMode::Direct] {
            let m = streamed(&path, store, budget, io, budget == all / 3);
            let mut seq = m.new_sequence(tokens.len());
            let got = m.forward(&tokens, 0, &mut seq, Outputs::All).unwrap();
            assert!(
                got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{f}: budget {budget}, {io:?}: logits differ"
            );
            let rep = diff(&want_trace, &trace_of(&m, &tokens), None);
            assert!(rep.identical(), "{f}: budget {budget}, {io:?}: {rep:?}");
            let resident = sample(&m, "expert_cache_resident_bytes");
            assert!(resident <= sample(&m, "expert_cache_budget_bytes"), "{f}: over budget");
            // Every expert came through the store: read on a miss, or (a budget that holds them all) warmed.
            assert!(sample(&m, "expert_cache_read_bytes_total") > 0.0);
            let (hits, misses) = (
                sample(&m, "expert_cache_hits_total"),
                sample(&m, "expert_cache_misses_total"),
            );
            println!(
                "{f} {:?}: budget {budget} {io:?}: hit rate {:.2}",
                s.layout(),
                hits / (hits + misses).max(1.0)
            );
        }
    }
}

/// A disk under the store that misbehaves on one read (numbered from 0), and from then on if `stays`:
/// it fails with EIO, or it returns the bytes with one bit flipped (a lying disk or a bad cable).
struct FaultyDisk {
    file: std::fs::File,
    reads: std::sync::atomic::AtomicUsize,
    at: usize,
    stays: bool,
    lies: bool,
}

impl titan_store::RecordSource for FaultyDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let i = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let faulty = i == self.at || self.stays && i > self.at;
        if faulty && !self.lies {
            return Err(std::io::Error::from_raw_os_error(5)); // EIO
        }
        let n = std::os::unix::fs::FileExt::read_at(&self.file, buf, offset)?;
        if faulty && n > 0 {
            buf[n / 2] ^= 0x04;
        }
        Ok(n)
    }
}

/// The fixture with its experts streamed (a budget of one expert per layer: every layer reads) from its
/// store through `disk`, and a handle on the source.
fn on_disk(path: &std::path::Path, store: &std::path::Path, disk: FaultyDisk) -> (Model, Arc<StreamedExperts>) {
    let mut model = Model::load(path).unwrap();
    let s = Store::open(store, &model.weights.file).unwrap().with_source(disk);
    let cache = ExpertCache::new(
        Arc::new(s),
        &titan_store::CacheOptions::new(titan_store::Budget::Bytes(1)),
    )
    .unwrap();
    let source = Arc::new(StreamedExperts::new(cache, model.weights.extras.clone(), true));
    model.experts = Box::new(source.clone());
    (model, source)
}

/// A read that fails once, or returns a flipped bit once (caught by its digest), is read again and the run
/// is the resident one, bit for bit; a disk that keeps failing or lying stops the run with an error naming
/// the file, and what the cache kept is whole.
#[test]
fn a_failing_or_lying_disk_never_changes_the_output_silently() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = fixtures().join(FILES[0]);
    let store = dir.path().join("m.titan");
    convert(
        &GgufFile::open(&path).unwrap(),
        &store,
        &ConvertOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    fails_or_lies(&path, &store, &store.join("experts.bin"));
    // In place, the disk under the store is the model's: three reads per expert, the same outcome.
    let index = dir.path().join("m.titan-index");
    write_index(&GgufFile::open(&path).unwrap(), &index, false, &mut |_, _| {}).unwrap();
    fails_or_lies(&path, &index, &path);
}

/// The model at `path` streamed from `store`, whose reads go to `file` through a faulty disk.
fn fails_or_lies(path: &std::path::Path, store: &std::path::Path, file: &std::path::Path) {
    let name = file.file_name().unwrap().to_str().unwrap();
    let disk = |at, stays, lies| FaultyDisk {
        file: std::fs::File::open(file).unwrap(),
        reads: Default::default(),
        at,
        stays,
        lies,
    };
    let resident = Model::load(path).unwrap();
    let tokens = resident.tokenizer.encode("A disk that fails", true, false);
    let want = trace_of(&resident, &tokens);
    let run = |m: &Model| {
        let opts = GenerateOptions {
            max_tokens: 8,
            n_ctx: 64,
            sampler: SamplerOptions {
                temperature: 0.9,
                seed: 3,
                ..Default::default()
            },
        };
        let mut t = Trace::default();
        m.generate_traced(&tokens, &opts, Some(&mut t), |_| {}).map(|_| t)
    };
    for at in [0, 5, 40] {
        for lies in [false, true] {
            let got = run(&on_disk(path, store, disk(at, false, lies)).0).unwrap();
            assert!(
                diff(&want, &got, None).identical(),
                "one bad read at {at} (lies: {lies}) changed the output"
            );
        }
        let err = run(&on_disk(path, store, disk(at, true, false)).0)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(name) && err.contains("Input/output error"), "{err}");

        let (m, source) = on_disk(path, store, disk(at, true, true));
        let err = run(&m).err().unwrap().to_string();
        assert!(err.contains("failed its digest check") && err.contains(name), "{err}");
        // Every record the cache kept is whole: read back through a healthy disk, each matches its digest.
        let cache = source.cache();
        let (n_layer, n_expert) = (m.config.n_layer, m.config.n_expert);
        let kept: Vec<(usize, usize)> = (0..n_layer)
            .flat_map(|l| (0..n_expert).map(move |e| (l, e)))
            .filter(|&(l, e)| cache.is_resident(l, e))
            .collect();
        let healthy = Store::open(store, &m.weights.file).unwrap();
        for (l, e) in kept {
            let rec = cache.get_layer(l, &[e as u32]).unwrap();
            let good = healthy.read(l, e).unwrap();
            for (kept, whole) in [
                (rec[0].gate(), good.gate()),
                (rec[0].up(), good.up()),
                (rec[0].down(), good.down()),
            ] {
                assert_eq!(
                    kept.data, whole.data,
                    "layer {l} expert {e}: the cache kept a damaged record"
                );
            }
        }
    }
}
