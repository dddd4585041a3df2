//! Helpers shared by the model tests.

use candle_core::{Device, Tensor};
use hearth::model::Transformer;

/// Logits of a 20-token prefill (the many-row product) and of three decode steps after it (one row).
pub fn prefill_and_decode(m: &Transformer) -> Vec<Vec<f32>> {
    let mut cache = m.new_cache();
    let mut out = Vec::new();
    let mut input: Vec<u32> = (0..20).map(|i| (i * 37 % 200) as u32 + 1).collect();
    for step in 0..4 {
        let t = Tensor::from_vec(input.clone(), (1, input.len()), &Device::Cpu).unwrap();
        let logits = m.forward(&t, Some(&mut cache), None).unwrap();
        out.push(logits.flatten_all().unwrap().to_vec1().unwrap());
        input = vec![(step * 41 + 7) as u32];
    }
    out
}

/// Whether this process is the child [`rerun_with`] started for `var=value`.
pub fn is_child(var: &str, value: &str) -> bool {
    std::env::var(var).as_deref() == Ok(value)
}

/// Runs the test `test` (its path in this binary) again in a child process with `var=value` set, asserts
/// that it passed there, and returns what it printed. The settings these tests cover are read from the
/// environment, which no test may change while other tests of the binary run.
pub fn rerun_with(test: &str, var: &str, value: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, value)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} with {var}={value}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
