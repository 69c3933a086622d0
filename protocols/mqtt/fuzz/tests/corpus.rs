//! Replays the committed seed corpus through the fuzz target on a stable toolchain.

use std::path::PathBuf;

#[test]
fn the_committed_corpus_runs_through_the_target() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus/decode_and_drive");
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus directory") {
        let data = std::fs::read(entry.expect("a corpus entry").path()).expect("a corpus file");
        ferrymq_mqtt_fuzz::decode_and_drive(&data);
        inputs += 1;
    }
    assert!(inputs >= 10, "only {inputs} corpus files in {}", dir.display());
}
