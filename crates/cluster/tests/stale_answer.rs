//! When the backbone's own share of a layer fails after the nodes were sent theirs, their answers are
//! still on the way: the next layer must not read them as its own. Here the backbone's work fails once
//! (its `meanwhile`, the shared expert, returns an error), and the next layer is answered by the node —
//! not failed over, not marked down — with the bits the backbone computes itself.

use titan_engine::experts::{ExpertJob, Experts};
use titan_engine::EngineError;
use titan_kernels::Activations;

mod common;

const TOKEN: &[u8] = b"stale-answer-test-token-0123456789";

#[test]
fn an_error_here_leaves_no_stale_answer_for_the_next_layer() {
    let (config, cluster) = common::one_node_cluster(TOKEN, false);
    let (_, reference) = titan_engine::Model::load_experts(common::fixture()).unwrap();

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
