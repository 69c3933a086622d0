//! libFuzzer entry point of [`ferrymq_mqtt_fuzz::decode_and_drive`] (`cargo +nightly fuzz run decode_and_drive`). Built
//! without `--cfg fuzzing` (a stable toolchain), it replays the files or directories named
//! on its command line instead.
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferrymq_mqtt_fuzz::decode_and_drive(data));

#[cfg(not(fuzzing))]
fn main() {
    let mut inputs = 0usize;
    for arg in std::env::args_os().skip(1) {
        let path = std::path::PathBuf::from(arg);
        let files = match std::fs::read_dir(&path) {
            Ok(dir) => dir.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(_) => vec![path],
        };
        for file in files {
            match std::fs::read(&file) {
                Ok(data) => {
                    ferrymq_mqtt_fuzz::decode_and_drive(&data);
                    inputs += 1;
                }
                Err(e) => eprintln!("{}: {e}", file.display()),
            }
        }
    }
    println!("replayed {inputs} inputs");
}
