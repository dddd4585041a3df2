//! Wire formats, HMAC and the golden vectors of shared/specs/federation-wire.md, byte for byte.

use hearth::federate::aggregate::{Method, aggregate_gym_blobs};
use hearth::federate::hmac_auth::{self, AuthError, ReplayCache, SignedRequest};
use hearth::federate::wire::{self, Rounding, Tensor};

const GOLDEN_BLOB: &str = "65000000000000007b2242223a7b226474797065223a2242463136222c227368617065223a5b312c325d2c226f666673657473223a5b302c345d7d2c2241223a7b226474797065223a2242463136222c227368617065223a5b315d2c226f666673657473223a5b342c365d7d7d803f20c04040";

#[test]
fn golden_hmac_put_hello() {
    let sig = hmac_auth::sign(
        b"s3cret",
        "PUT",
        "/v1/round/0/worker/w1",
        1_700_000_000,
        None,
        b"hello",
    );
    assert_eq!(
        sig,
        "383f10ff4464264fb391f7d4fb9ad0bd424ecdff75249cd4103bd82b4a284ac2"
    );
}

#[test]
fn golden_hmac_get_aggregate_empty_body() {
    let sig = hmac_auth::sign(
        b"s3cret",
        "GET",
        "/v1/round/0/aggregate",
        1_700_000_000,
        None,
        b"",
    );
    assert_eq!(
        sig,
        "dc6b09c76a66dc9f9244c37c7055f2b1da47b4f4d26545edd704c28cfcf177e6"
    );
}

fn golden_req(sig: &str) -> SignedRequest<'_> {
    SignedRequest {
        method: "PUT",
        path: "/v1/round/0/worker/w1",
        ts: "1700000000",
        sig,
        nonce: None,
        body: b"hello",
    }
}

#[test]
fn golden_skew_299_accepted_301_rejected() {
    let sig = "383f10ff4464264fb391f7d4fb9ad0bd424ecdff75249cd4103bd82b4a284ac2";
    let ts = 1_700_000_000;
    assert!(hmac_auth::verify(b"s3cret", &golden_req(sig), ts + 299, 300).is_ok());
    assert!(hmac_auth::verify(b"s3cret", &golden_req(sig), ts - 299, 300).is_ok());
    assert_eq!(
        hmac_auth::verify(b"s3cret", &golden_req(sig), ts + 301, 300),
        Err(AuthError::Stale)
    );
    assert_eq!(
        hmac_auth::verify(b"s3cret", &golden_req(sig), ts - 301, 300),
        Err(AuthError::Stale)
    );
}

#[test]
fn tampered_body_and_wrong_key_rejected() {
    let sig = "383f10ff4464264fb391f7d4fb9ad0bd424ecdff75249cd4103bd82b4a284ac2";
    let mut r = golden_req(sig);
    r.body = b"hellO";
    assert_eq!(
        hmac_auth::verify(b"s3cret", &r, 1_700_000_000, 300),
        Err(AuthError::Signature)
    );
    assert_eq!(
        hmac_auth::verify(b"other", &golden_req(sig), 1_700_000_000, 300),
        Err(AuthError::Signature)
    );
    let mut r = golden_req("zz");
    r.body = b"hello";
    assert!(matches!(
        hmac_auth::verify(b"s3cret", &r, 1_700_000_000, 300),
        Err(AuthError::Header(_))
    ));
}

#[test]
fn nonce_is_signed() {
    let a = hmac_auth::sign(b"k", "GET", "/p", 1, Some("n1"), b"");
    let b = hmac_auth::sign(b"k", "GET", "/p", 1, Some("n2"), b"");
    assert_ne!(a, b);
    let req = SignedRequest {
        method: "GET",
        path: "/p",
        ts: "1",
        sig: &a,
        nonce: Some("n2"),
        body: b"",
    };
    assert_eq!(
        hmac_auth::verify(b"k", &req, 1, 300),
        Err(AuthError::Signature)
    );
}

#[test]
fn replay_same_signature_rejected_until_it_expires() {
    let c = ReplayCache::new(16);
    let s = [7u8; 32];
    assert!(c.check_and_insert(s, 1300, 1000).is_ok());
    assert_eq!(c.check_and_insert(s, 1300, 1001), Err(AuthError::Replay));
    // After expiry the skew check rejects it anyway; the cache forgets it.
    assert!(c.check_and_insert([8u8; 32], 1700, 1400).is_ok());
    assert_eq!(c.len(), 1);
}

#[test]
fn replay_cache_full_refuses_instead_of_evicting() {
    let c = ReplayCache::new(2);
    assert!(c.check_and_insert([1; 32], 2000, 1000).is_ok());
    assert!(c.check_and_insert([2; 32], 2000, 1000).is_ok());
    assert_eq!(
        c.check_and_insert([3; 32], 2000, 1000),
        Err(AuthError::CacheFull)
    );
    assert_eq!(
        c.check_and_insert([1; 32], 2000, 1000),
        Err(AuthError::Replay)
    );
}

fn golden_tensors() -> Vec<Tensor> {
    vec![
        Tensor::new("B", vec![1, 2], vec![1.0, -2.5]),
        Tensor::new("A", vec![1], vec![3.0]),
    ]
}

#[test]
fn golden_gym_blob_encode() {
    let blob = wire::encode_gym(&golden_tensors(), Rounding::Truncate).unwrap();
    assert_eq!(hmac_auth::to_hex(&blob), GOLDEN_BLOB);
}

#[test]
fn golden_gym_blob_decode_keeps_insertion_order() {
    let blob = hmac_auth::from_hex(GOLDEN_BLOB).unwrap();
    let d = wire::decode_gym(&blob).unwrap();
    assert_eq!(d, golden_tensors());
    let v = wire::decode_gym_view(&blob).unwrap();
    assert_eq!(v.flat.map(|f| f.len()), Some(6));
}

#[test]
fn golden_gym_blob_rejected_by_real_safetensors_reader() {
    let blob = hmac_auth::from_hex(GOLDEN_BLOB).unwrap();
    assert!(wire::decode_safetensors(&blob).is_err());
}

#[test]
fn golden_bf16_widening_is_shift() {
    for bits in [0x3f80u16, 0xc020, 0x4040, 0x0001, 0x7f7f, 0x8000] {
        assert_eq!(wire::bf16_to_f32(bits).to_bits(), (bits as u32) << 16);
    }
}

#[test]
fn bf16_rne_ties_and_truncation() {
    let f = f32::from_bits;
    // Exactly halfway between 0x3f80 and 0x3f81: ties to even (0x3f80); truncation also 0x3f80.
    assert_eq!(wire::f32_to_bf16_rne(f(0x3f80_8000)), 0x3f80);
    // Halfway between 0x3f81 (odd) and 0x3f82: ties to even goes up.
    assert_eq!(wire::f32_to_bf16_rne(f(0x3f81_8000)), 0x3f82);
    assert_eq!(wire::f32_to_bf16_trunc(f(0x3f81_8000)), 0x3f81);
    // Just above / below a tie.
    assert_eq!(wire::f32_to_bf16_rne(f(0x3f80_8001)), 0x3f81);
    assert_eq!(wire::f32_to_bf16_rne(f(0x3f81_7fff)), 0x3f81);
    // Negative tie, and a tie that carries into the exponent.
    assert_eq!(wire::f32_to_bf16_rne(f(0xbf81_8000)), 0xbf82);
    assert_eq!(wire::f32_to_bf16_rne(f(0x3fff_8000)), 0x4000);
    // NaN stays NaN under RNE.
    assert!(wire::bf16_to_f32(wire::f32_to_bf16_rne(f32::NAN)).is_nan());
}

fn gym_agg(vals: &[f32], m: Method) -> f32 {
    let blobs: Vec<Vec<u8>> = vals
        .iter()
        .map(|&v| {
            wire::encode_gym(&[Tensor::new("x", vec![1], vec![v])], Rounding::Truncate).unwrap()
        })
        .collect();
    let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    let out = aggregate_gym_blobs(&refs, None, m, Rounding::Truncate, 1).unwrap();
    wire::decode_gym(&out).unwrap()[0].data[0]
}

#[test]
fn golden_aggregation_checks() {
    assert_eq!(gym_agg(&[1.0, 2.0, 3.0, 100.0], Method::GymRobust), 2.5);
    assert_eq!(gym_agg(&[1.0, 2.0, 100.0], Method::GymRobust), 34.25);
    assert_eq!(gym_agg(&[1.0, 2.0, 3.0, 100.0], Method::Median), 2.5);
    assert_eq!(gym_agg(&[1.0, 2.0, 3.0, 100.0], Method::Mean), 26.5);
    assert_eq!(Method::from_gym_name("byzantine_robust"), Method::GymRobust);
    assert_eq!(Method::from_gym_name("whatever"), Method::Mean);
}

#[test]
fn gym_decoder_refuses_hostile_headers() {
    let mut bad_len = hmac_auth::from_hex(GOLDEN_BLOB).unwrap();
    bad_len[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(wire::decode_gym(&bad_len).is_err());
    assert!(wire::decode_gym(&[1, 2, 3]).is_err());
    let hdr = br#"{"x":{"dtype":"BF16","shape":[4],"offsets":[0,8]}}"#;
    let mut b = (hdr.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(hdr);
    b.extend_from_slice(&[0, 0]); // 2 bytes where 8 are declared
    assert!(wire::decode_gym(&b).is_err());
    let hdr = br#"{"x":{"dtype":"F64","shape":[1],"offsets":[0,8]}}"#;
    let mut b = (hdr.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(hdr);
    b.extend_from_slice(&[0; 8]);
    assert!(wire::decode_gym(&b).is_err());
    // Non-finite values are refused at ingress.
    let nan = wire::encode_gym(
        &[Tensor::new("x", vec![1], vec![f32::INFINITY])],
        Rounding::Truncate,
    )
    .unwrap();
    assert!(wire::decode_gym(&nan).is_err());
}

#[test]
fn native_safetensors_peft_roundtrip() {
    let a = wire::peft_lora_key(0, "self_attn.q_proj", 'A');
    assert_eq!(
        a,
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    );
    let b = wire::peft_lora_key(0, "self_attn.q_proj", 'B');
    let t = vec![
        Tensor::new(
            a.clone(),
            vec![2, 3],
            vec![0.5, -1.0, 0.25, 3.0, 1.0 / 3.0, -0.125],
        ),
        Tensor::new(
            b.clone(),
            vec![4, 2],
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        ),
    ];
    let bytes = wire::encode_safetensors(&t, Rounding::NearestEven, None).unwrap();
    // A real safetensors reader accepts it, with BF16 and PEFT names.
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let v = st.tensor(&a).unwrap();
    assert_eq!(v.dtype(), safetensors::Dtype::BF16);
    assert_eq!(v.shape(), &[2, 3]);
    let back = wire::decode_safetensors(&bytes).unwrap();
    assert_eq!(back[0].name, a);
    // 1/3 is rounded to nearest: 0x3eab (not the truncated 0x3eaa).
    assert_eq!(back[0].data[4].to_bits() >> 16, 0x3eab);
    assert_eq!(back[1].data, t[1].data);
    let cfg: wire::AdapterConfig =
        serde_json::from_str(r#"{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj"],"lora_dropout":0.05}"#)
            .unwrap();
    assert_eq!(cfg.scale(), 2.0);
}
