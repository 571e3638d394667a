//! When the backbone's own share of a layer fails after the nodes were sent theirs, their answers are
//! still on the way: the next layer must not read them as its own. Here the backbone's work fails once
//! (its `meanwhile`, the shared expert, returns an error), and the next layer is answered by the node —
//! not failed over, not marked down — with the bits the backbone computes itself.

use std::path::PathBuf;
use std::time::Duration;

use titan_cluster::{Cluster, ClusterOptions, Placement, WorkerOptions};
use titan_engine::experts::{ExpertJob, Experts};
use titan_engine::EngineError;
use titan_kernels::Activations;

const TOKEN: &[u8] = b"stale-answer-test-token-0123456789";

#[test]
fn an_error_here_leaves_no_stale_answer_for_the_next_layer() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3moe/q8_0.gguf");
    let (tx, rx) = std::sync::mpsc::channel();
    let node = path.clone();
    std::thread::spawn(move || {
        let opts = WorkerOptions {
            listen: "127.0.0.1:0".into(),
            token: TOKEN.to_vec(),
            max_frame: titan_net::DEFAULT_MAX_FRAME,
            encrypt: false,
        };
        titan_cluster::node::serve_model(&node, None, false, opts, |addr| tx.send(addr).unwrap()).unwrap();
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).unwrap();

    let (config, local) = titan_engine::Model::load_experts(&path).unwrap();
    let (_, reference) = titan_engine::Model::load_experts(&path).unwrap();
    let identity = titan_layout::ModelIdentity::of(&titan_gguf::GgufFile::open(&path).unwrap()).unwrap();
    let cluster = Cluster::connect(
        Box::new(local),
        config.n_layer,
        config.dense_lead,
        config.n_expert,
        ClusterOptions {
            nodes: vec![addr.to_string()],
            token: TOKEN.to_vec(),
            placement: Placement::Contiguous,
            replicas: 1,
            timeout: Duration::from_secs(30),
            model: identity.to_string(),
            hot: Vec::new(),
            backbone_share: false,
            audit: 0.0,
            encrypt: false,
        },
    )
    .unwrap();

    // Three rows, every expert: the node holds them all and is sent every one.
    let d = config.n_embd;
    let x: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let ids: Vec<u32> = (0..config.n_expert as u32).collect();
    let rows: Vec<usize> = ids.iter().flat_map(|_| 0..3).collect();
    let starts: Vec<usize> = (0..=ids.len()).map(|i| 3 * i).collect();
    let outputs = |source: &dyn Experts, layer: usize, fail: bool| -> Result<Vec<Vec<f32>>, EngineError> {
        let mut input = Activations::new();
        input.quantize(source.input_type(layer)?, &x, 3, d)?;
        let job = ExpertJob {
            layer,
            input: &input,
            ids: &ids,
            rows: &rows,
            starts: &starts,
        };
        let mut out = vec![Vec::new(); ids.len()];
        let mut meanwhile = || {
            if fail {
                Err(EngineError::Request("the backbone's own work failed".into()))
            } else {
                Ok(())
            }
        };
        source.apply(&job, &mut meanwhile, &mut |i, y| out[i] = y.to_vec())?;
        Ok(out)
    };
    let (first, second) = (config.dense_lead, config.dense_lead + 1);
    assert!(second < config.n_layer, "the fixture has two MoE layers");
    let e = outputs(&cluster, first, true).unwrap_err();
    assert!(e.to_string().contains("the backbone's own work failed"), "{e}");
    let got = outputs(&cluster, second, false).unwrap();
    let want = outputs(&reference, second, false).unwrap();
    let bits =
        |v: &Vec<Vec<f32>>| -> Vec<Vec<u32>> { v.iter().map(|y| y.iter().map(|f| f.to_bits()).collect()).collect() };
    assert_eq!(bits(&got), bits(&want), "the next layer's outputs");
    let m = &cluster.metrics()[0].1;
    assert_eq!((m.failovers, m.downs), (0, 0), "the node was failed over: {m:?}");
    assert_eq!(m.round_trips, 2, "{m:?}");
}
