//! Decode-step throughput of the kernels alone at real model shapes (ignored: run on a lent GPU by
//! `scripts/gpu_device_check.sh`). One step is what a decode step on the GPU launches per token: per layer
//! norm, int8 quantization of its output, q/k/v, rope, cache append, attention, quantization, output projection,
//! residual, norm, quantization, gate/up, SiLU·mul, quantization, down, residual; then the final norm and the
//! head. Weights are random Q8_0 of the model's sizes: the time
//! depends on the bytes read and the launches, not on the values.
//!
//! `HEARTH_GPU_SHAPE` picks `smollm2-135m` (default) or `smollm2-1.7b`; `HEARTH_GPU_STEPS` the steps timed.
//! Runs the step launch by launch, then captured once as a graph and replayed. Prints one JSON line.

use std::time::Instant;

use hearth::gpu::Buffer;
use hearth::gpu::ops::{self, AttentionShape, Rotation};

use super::gpus;

struct Shape {
    name: &'static str,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "smollm2-135m",
        hidden: 576,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        ffn: 1536,
        vocab: 49152,
    },
    Shape {
        name: "smollm2-1.7b",
        hidden: 2048,
        layers: 24,
        heads: 32,
        kv_heads: 32,
        head_dim: 64,
        ffn: 8192,
        vocab: 49152,
    },
];

fn q8(gpu: &hearth::gpu::Gpu, n: usize, k: usize, seed: u8) -> Buffer<u8> {
    let mut bytes = vec![seed; n * k / 32 * 34];
    // Small f16 scales (0x2000 ≈ 0.0078) so activations stay finite over many layers.
    for b in bytes.chunks_mut(34) {
        b[0] = 0x00;
        b[1] = 0x20;
    }
    gpu.upload(&bytes).unwrap()
}

#[test]
#[ignore = "throughput on a GPU: scripts/gpu_device_check.sh runs it"]
fn decode_step_throughput() {
    let name = std::env::var("HEARTH_GPU_SHAPE").unwrap_or_else(|_| "smollm2-135m".into());
    let steps: usize = std::env::var("HEARTH_GPU_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let s = SHAPES.iter().find(|s| s.name == name).unwrap_or_else(|| {
        panic!("HEARTH_GPU_SHAPE={name}: not one of smollm2-135m, smollm2-1.7b")
    });
    for gpu in gpus("decode_step_throughput") {
        let (h, hd) = (s.hidden, s.head_dim);
        let (qd, kvd) = (s.heads * hd, s.kv_heads * hd);
        let capacity = (steps + 8).min(8192);
        assert!(
            steps + 8 <= capacity,
            "HEARTH_GPU_STEPS={steps}: at most 8184"
        );
        let att = AttentionShape {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: hd,
            capacity,
        };
        struct Layer {
            norm1: Buffer<f32>,
            norm2: Buffer<f32>,
            q: Buffer<u8>,
            k: Buffer<u8>,
            v: Buffer<u8>,
            o: Buffer<u8>,
            gate: Buffer<u8>,
            up: Buffer<u8>,
            down: Buffer<u8>,
            kc: Buffer<f32>,
            vc: Buffer<f32>,
        }
        let layers: Vec<Layer> = (0..s.layers)
            .map(|i| Layer {
                norm1: gpu.upload(&vec![1.0f32; h]).unwrap(),
                norm2: gpu.upload(&vec![1.0f32; h]).unwrap(),
                q: q8(&gpu, qd, h, i as u8),
                k: q8(&gpu, kvd, h, 1),
                v: q8(&gpu, kvd, h, 2),
                o: q8(&gpu, h, qd, 3),
                gate: q8(&gpu, s.ffn, h, 4),
                up: q8(&gpu, s.ffn, h, 5),
                down: q8(&gpu, h, s.ffn, 6),
                kc: gpu.zeros(kvd * capacity).unwrap(),
                vc: gpu.zeros(kvd * capacity).unwrap(),
            })
            .collect();
        let head = q8(&gpu, s.vocab, h, 7);
        let final_norm = gpu.upload(&vec![1.0f32; h]).unwrap();
        let half = hd / 2;
        let cos = gpu.upload(&vec![1.0f32; capacity * half]).unwrap();
        let sin = gpu.zeros::<f32>(capacity * half).unwrap();
        let x = gpu.upload(&vec![0.01f32; h]).unwrap();
        let normed = gpu.zeros::<f32>(h).unwrap();
        let (q, k, v, ctx, proj) = (
            gpu.zeros::<f32>(qd).unwrap(),
            gpu.zeros::<f32>(kvd).unwrap(),
            gpu.zeros::<f32>(kvd).unwrap(),
            gpu.zeros::<f32>(qd).unwrap(),
            gpu.zeros::<f32>(h).unwrap(),
        );
        let (g, u, act) = (
            gpu.zeros::<f32>(s.ffn).unwrap(),
            gpu.zeros::<f32>(s.ffn).unwrap(),
            gpu.zeros::<f32>(s.ffn).unwrap(),
        );
        let logits = gpu.zeros::<f32>(s.vocab).unwrap();
        let widest = h.max(qd).max(s.ffn);
        let (xq, xd) = (
            gpu.zeros::<i8>(widest).unwrap(),
            gpu.zeros::<f32>(widest / 32).unwrap(),
        );
        // Each stage's input quantized to int8 once, then its products, as `GpuDecoder` runs them.
        let quant =
            |x: &Buffer<f32>, k: usize| ops::quantize_q8(&gpu, x, &xq, &xd, (1, k)).unwrap();
        let mm = |w: &Buffer<u8>, y: &Buffer<f32>, k: usize, n: usize| {
            ops::q8_matmul_q8(&gpu, w, (&xq, &xd), y, (1, k, n)).unwrap()
        };
        let len = gpu.upload(&[0i32]).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut launches = 0usize;
        let step = |launches: &mut usize| {
            for l in &layers {
                ops::rms_norm(&gpu, &x, &l.norm1, &normed, (1, h), 1e-5).unwrap();
                quant(&normed, h);
                mm(&l.q, &q, h, qd);
                mm(&l.k, &k, h, kvd);
                mm(&l.v, &v, h, kvd);
                ops::rope(
                    &gpu,
                    &q,
                    &cos,
                    &sin,
                    &len,
                    (1, s.heads, hd),
                    true,
                    Rotation::Forward,
                )
                .unwrap();
                ops::rope(
                    &gpu,
                    &k,
                    &cos,
                    &sin,
                    &len,
                    (1, s.kv_heads, hd),
                    true,
                    Rotation::Forward,
                )
                .unwrap();
                ops::kv_append(&gpu, &l.kc, &k, &len, 1, att).unwrap();
                ops::kv_append(&gpu, &l.vc, &v, &len, 1, att).unwrap();
                ops::attention_decode(&gpu, &q, &l.kc, &l.vc, &ctx, &len, 1, att, scale).unwrap();
                quant(&ctx, qd);
                mm(&l.o, &proj, qd, h);
                ops::add_into(&gpu, &x, &proj, h).unwrap();
                ops::rms_norm(&gpu, &x, &l.norm2, &normed, (1, h), 1e-5).unwrap();
                quant(&normed, h);
                mm(&l.gate, &g, h, s.ffn);
                mm(&l.up, &u, h, s.ffn);
                ops::silu_mul(&gpu, &g, &u, &act, s.ffn).unwrap();
                quant(&act, s.ffn);
                mm(&l.down, &proj, s.ffn, h);
                ops::add_into(&gpu, &x, &proj, h).unwrap();
                *launches += 20;
            }
            ops::rms_norm(&gpu, &x, &final_norm, &normed, (1, h), 1e-5).unwrap();
            quant(&normed, h);
            mm(&head, &logits, h, s.vocab);
            ops::advance(&gpu, &len, 1).unwrap();
            *launches += 4;
        };
        // Warm-up compiles and loads every kernel.
        for _ in 0..3 {
            step(&mut launches);
        }
        gpu.synchronize().unwrap();
        gpu.write(&len, &[0]).unwrap();
        launches = 0;
        let t = Instant::now();
        for _ in 0..steps {
            step(&mut launches);
        }
        gpu.synchronize().unwrap();
        let secs = t.elapsed().as_secs_f64();
        let out = gpu.download(&logits).unwrap();
        assert!(out.iter().all(|v| v.is_finite()), "non-finite logits");
        // The same step captured once and replayed: one submission per token.
        gpu.write(&len, &[0]).unwrap();
        let mut captured = 0usize;
        let graph_secs = match gpu.capture(|_| {
            step(&mut captured);
            Ok(())
        }) {
            Ok(graph) => {
                gpu.write(&len, &[0]).unwrap();
                let t = Instant::now();
                for _ in 0..steps {
                    graph.replay().unwrap();
                }
                gpu.synchronize().unwrap();
                let secs = t.elapsed().as_secs_f64();
                let replayed = gpu.download(&logits).unwrap();
                assert!(replayed.iter().all(|v| v.is_finite()), "non-finite logits");
                Some(secs)
            }
            Err(e) => {
                eprintln!("decode_step_throughput: no graph capture ({e})");
                None
            }
        };
        let weight_bytes =
            s.layers * (2 * h * qd + 2 * h * kvd + 3 * h * s.ffn) / 32 * 34 + s.vocab * h / 32 * 34;
        let graph = graph_secs.map_or("null".to_string(), |g| format!("{:.1}", steps as f64 / g));
        println!(
            "{{\"test\":\"decode_step\",\"device\":\"{}\",\"shape\":\"{}\",\"steps\":{steps},\"tokens_per_s\":{:.1},\"graph_tokens_per_s\":{graph},\"ms_per_token\":{:.3},\"launches_per_token\":{},\"weight_gb_per_s\":{:.1}}}",
            gpu.describe(),
            s.name,
            steps as f64 / secs,
            secs * 1e3 / steps as f64,
            launches / steps,
            weight_bytes as f64 * steps as f64 / secs / 1e9
        );
    }
}
