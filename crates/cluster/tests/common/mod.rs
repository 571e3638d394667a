//! What the cluster's in-process tests share: a node serving the qwen3moe fixture on a thread of its own,
//! and a backbone's cluster of that one node.

use std::path::PathBuf;
use std::time::Duration;

use titan_cluster::{Cluster, ClusterOptions, Placement, WorkerOptions};
use titan_engine::Config;

/// The fixture every test here runs.
pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3moe/q8_0.gguf")
}

/// A node serving the fixture on loopback (taking dense rows too when `rows`), and a cluster over it that
/// leaves every expert to the node; the model's config beside it.
pub fn one_node_cluster(token: &[u8], rows: bool) -> (Config, Cluster) {
    let path = fixture();
    let (tx, rx) = std::sync::mpsc::channel();
    let (node, node_token) = (path.clone(), token.to_vec());
    std::thread::spawn(move || {
        let opts = WorkerOptions {
            listen: "127.0.0.1:0".into(),
            token: node_token,
            max_frame: titan_net::DEFAULT_MAX_FRAME,
            encrypt: false,
        };
        titan_cluster::node::serve_model(&node, None, rows, opts, |addr| tx.send(addr).unwrap()).unwrap();
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).unwrap();

    let (config, local) = titan_engine::Model::load_experts(&path).unwrap();
    let identity = titan_layout::ModelIdentity::of(&titan_gguf::GgufFile::open(&path).unwrap()).unwrap();
    let cluster = Cluster::connect(
        Box::new(local),
        config.n_layer,
        config.dense_lead,
        config.n_expert,
        ClusterOptions {
            nodes: vec![addr.to_string()],
            token: token.to_vec(),
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
    (config, cluster)
}
