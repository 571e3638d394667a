//! The `http_request` fuzz target's corpus and regressions, replayed on stable (see `fuzz/README.md`).

#[path = "fuzz/http_request.rs"]
mod http_request;
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn request_bodies_are_accepted_in_range_or_refused_with_a_4xx() {
    let template = http_request::template(&replay::repo_root());
    replay::replay("http_request", |data| http_request::run(&template, data));
}
