//! The `aot` output without a GPU: the winners of a journal exported as a C
//! dispatcher, its source compiled with `cc` and linked against a stub of
//! the CUDA driver API (declared here) that records every launch, then run
//! for shapes tuned and untuned: the dispatcher must pick the winner of the
//! shape's M bucket (aiter's `get_gemm_config` rule, written out here on its
//! own), and launch it with the grid, block, shared memory and arguments the
//! manifest's expressions give at that shape.
//!
//! The images are real: the CUDA winners compiled by NVRTC, the Triton ones
//! by a compile worker for sm_90, both found through `TUNELAB_TEST_PYTHON`
//! (a Python with torch and Triton). Without it the test says so and passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use indexmap::IndexMap;
use serde_json::{json, Value as Json};

use tunelab::backend::native::images::{context, eval};
use tunelab::backend::native::NativeCompiler;
use tunelab::backend::{PythonBackend, WorkerSpec};
use tunelab::device;
use tunelab::emit::aot::{self, Condition, Interface, LeftOut, Library, Param, Spec};
use tunelab::emit::{triton_mbucket, Selection};
use tunelab::manifest::{self, device_fields, Experiment, MethodKind};
use tunelab::plan::Job;
use tunelab::store::{JobRecord, Results};
use tunelab::workbench::aot::{export, TritonImages, WorkerImages};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn test_python() -> Option<PathBuf> {
    match std::env::var_os("TUNELAB_TEST_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("skipped: set TUNELAB_TEST_PYTHON to a Python with torch and Triton");
            None
        }
    }
}

/// The quickstart fixture journal, with CUDA jobs that win some shapes.
fn results() -> Results {
    let (mut r, warnings) =
        tunelab::store::journal::read_file(&repo().join("tests/fixtures/journals/gemm.jsonl"))
            .unwrap();
    assert!(warnings.is_empty());
    // (M, N, config, median µs): faster than the Triton best at 512, 4096
    // (N=4096) and 32 (N=1024); slower at 12288.
    let cuda = [
        (512, 4096, [128, 128, 32, 2, 2, 3], 20.0),
        (4096, 4096, [128, 128, 32, 2, 4, 3], 200.0),
        (12288, 4096, [64, 64, 32, 2, 2, 2], 5000.0),
        (32, 1024, [64, 64, 32, 2, 2, 2], 3.0),
    ];
    for (m, n, c, us) in cuda {
        let template = r
            .jobs
            .iter()
            .find(|j| {
                j.method == "triton" && j.shape["M"] == m && j.shape["N"] == n && j.stats.is_some()
            })
            .unwrap()
            .clone();
        let mut j: JobRecord = template;
        j.job_id = format!("cuda-{m}-{n}");
        j.method = "cuda".into();
        j.kind = MethodKind::Cuda;
        j.kernel = "gemm_mma".into();
        j.baseline = false;
        let [bm, bn, bk, wm, wn, st] = c;
        j.config = IndexMap::from_iter(
            [
                ("BLOCK_M", bm),
                ("BLOCK_N", bn),
                ("BLOCK_K", bk),
                ("WARPS_M", wm),
                ("WARPS_N", wn),
                ("STAGES", st),
                ("SMEM", st * (bm * (bk + 8) + bk * (bn + 8)) * 2),
            ]
            .map(|(k, v)| (k.to_string(), json!(v))),
        );
        let s = j.stats.as_mut().unwrap();
        for v in [
            &mut s.median_us,
            &mut s.ci_low_us,
            &mut s.ci_high_us,
            &mut s.min_us,
            &mut s.q1_us,
            &mut s.q3_us,
            &mut s.mean_us,
        ] {
            *v = us;
        }
        r.jobs.push(j);
    }
    r
}

/// The fastest Triton or CUDA best of each shape of one (N, K), by M.
fn winners(results: &Results, n: i64) -> BTreeMap<i64, JobRecord> {
    let sel = Selection::build(results, |j| j.method == "triton" || j.method == "cuda");
    let mut out = BTreeMap::new();
    for s in &sel.shapes {
        if s.shape["N"] != n {
            continue;
        }
        let (_, best) = s.overall_best().unwrap();
        out.insert(s.m().unwrap(), best.job.clone());
    }
    out
}

/// aiter's `get_gemm_config` over a tuned table: `M_LEQ_x` for the
/// smallest standard bound x >= M among those a tuned M filled (each
/// holding its largest tuned M), else `M_GEQ_8192`, else `any` (the
/// largest tuned M). Returns the tuned M whose winner serves `m`.
fn lookup(tuned: &[i64], m: i64) -> i64 {
    let bounds = triton_mbucket::BOUNDS;
    let mut leq: BTreeMap<i64, i64> = BTreeMap::new();
    let mut geq = None;
    for &t in tuned {
        match bounds.iter().find(|&&x| t <= x) {
            Some(&x) => {
                let e = leq.entry(x).or_insert(t);
                *e = (*e).max(t);
            }
            None => geq = Some(geq.map_or(t, |g: i64| g.max(t))),
        }
    }
    if let Some((_, &t)) = leq.iter().find(|(x, _)| m <= **x) {
        return t;
    }
    if m >= 8192 {
        if let Some(g) = geq {
            return g;
        }
    }
    *tuned.iter().max().unwrap()
}

const STUB_H: &str = r#"/* The few CUDA driver API declarations the generated code uses. */
#ifndef STUB_CUDA_H
#define STUB_CUDA_H
typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_NOT_FOUND 500
typedef unsigned long long CUdeviceptr;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef enum { CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 } CUfunction_attribute;
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuModuleUnload(CUmodule m);
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int value);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream stream, void **params, void **extra);
#endif
"#;

/// The stub driver: images must be ELF and hold the symbol asked for;
/// every launch is printed as a JSON line with its parameters, read with
/// the sizes `SIZES` gives per symbol.
fn stub_c(sizes: &[(String, Vec<usize>)]) -> String {
    let mut table = String::new();
    for (symbol, s) in sizes {
        let list: Vec<String> = s.iter().map(|x| x.to_string()).collect();
        table.push_str(&format!(
            "    {{\"{symbol}\", {}, {{{}}}}},\n",
            s.len(),
            if list.is_empty() {
                "0".into()
            } else {
                list.join(", ")
            }
        ));
    }
    format!(
        r#"#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "cuda.h"

struct CUmod_st {{ const unsigned char *image; size_t size; }};
struct CUfunc_st {{ char name[256]; }};
struct sizes {{ const char *symbol; int count; int size[32]; }};
static const struct sizes SIZES[] = {{
{table}    {{NULL, 0, {{0}}}}
}};

static size_t elf_size(const unsigned char *image) {{
    /* The section header table ends the image: e_shoff + e_shnum * e_shentsize. */
    uint64_t shoff; uint16_t shentsize, shnum;
    memcpy(&shoff, image + 0x28, 8);
    memcpy(&shentsize, image + 0x3a, 2);
    memcpy(&shnum, image + 0x3c, 2);
    return (size_t)(shoff + (uint64_t)shnum * shentsize);
}}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {{
    const unsigned char *p = image;
    if (memcmp(p, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
    struct CUmod_st *m = malloc(sizeof *m);
    m->image = p;
    m->size = elf_size(p);
    *module = m;
    printf("{{\"load\": %zu}}\n", m->size);
    return CUDA_SUCCESS;
}}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {{
    if (!memmem(m->image, m->size, name, strlen(name) + 1)) return CUDA_ERROR_NOT_FOUND;
    struct CUfunc_st *fn = malloc(sizeof *fn);
    snprintf(fn->name, sizeof fn->name, "%s", name);
    *f = fn;
    return CUDA_SUCCESS;
}}

CUresult cuModuleUnload(CUmodule m) {{ free(m); return CUDA_SUCCESS; }}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int value) {{
    printf("{{\"attribute\": %d, \"value\": %d, \"symbol\": \"%s\"}}\n", (int)a, value, f->name);
    return CUDA_SUCCESS;
}}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream stream, void **params, void **extra) {{
    (void)stream; (void)extra;
    const struct sizes *s = SIZES;
    while (s->symbol && strcmp(s->symbol, f->name) != 0) s++;
    if (!s->symbol) return CUDA_ERROR_NOT_FOUND;
    printf("{{\"symbol\": \"%s\", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], \"shared\": %u, \"params\": [",
           f->name, gx, gy, gz, bx, by, bz, shared);
    for (int i = 0; i < s->count; i++) {{
        long long v = 0;
        switch (s->size[i]) {{
        case 1: v = *(int8_t *)params[i]; break;
        case 2: v = *(int16_t *)params[i]; break;
        case 4: v = *(int32_t *)params[i]; break;
        default: v = *(int64_t *)params[i]; break;
        }}
        printf("%s%lld", i ? ", " : "", v);
    }}
    printf("]}}\n");
    return CUDA_SUCCESS;
}}
"#
    )
}

/// Calls the dispatcher for each `M,N,K,misalign` argument.
fn main_c(prefix: &str) -> String {
    format!(
        r#"#include <stdio.h>
#include <stdlib.h>
#include "{prefix}.h"

int main(int argc, char **argv) {{
    for (int i = 1; i < argc; i++) {{
        long long m, n, k, off;
        if (sscanf(argv[i], "%lld,%lld,%lld,%lld", &m, &n, &k, &off) != 4) return 2;
        CUdeviceptr a = 0x100000 + (CUdeviceptr)off, b = 0x200000, out = 0x300000;
        int spec = {prefix}_choose(a, b, out, m, n, k);
        printf("{{\"call\": \"%s\", \"spec\": %d}}\n", argv[i], spec);
        CUresult r = {prefix}_launch(NULL, a, b, out, m, n, k);
        printf("{{\"result\": %d}}\n", (int)r);
    }}
    {prefix}_unload();
    return 0;
}}
"#
    )
}

fn c_size(c_type: &str) -> usize {
    match c_type {
        "int8_t" | "uint8_t" => 1,
        "int16_t" | "uint16_t" => 2,
        "int32_t" | "uint32_t" | "float" => 4,
        _ => 8,
    }
}

fn compile_worker(python: &Path, dir: &Path) -> WorkerImages {
    let spec = WorkerSpec {
        python: python.display().to_string(),
        python_path: vec![repo().join("python")],
        role: "compile".into(),
        interpret: false,
        visible_device: None,
        visible_var: "CUDA_VISIBLE_DEVICES",
        target: Some("cuda:90:32".into()),
        triton_cache: Some(dir.join("triton-cache")),
        log: dir.join("compile.log"),
        background: false,
    };
    WorkerImages::new(
        PythonBackend::new(spec, "gemm", Duration::from_secs(600)),
        dir.join("scratch"),
    )
}

fn load_manifest() -> Experiment {
    manifest::load(
        &repo().join("tests/fixtures/aot/gemm.yaml"),
        &[],
        &device::profile("h100").unwrap(),
    )
    .unwrap_or_else(|d| panic!("{d}"))
}

#[test]
fn the_dispatcher_picks_each_m_buckets_winner_and_launches_it_as_the_manifest_says() {
    let Some(python) = test_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let results = results();
    let exp = load_manifest();
    let header = results.header.as_ref().unwrap();
    let native = NativeCompiler::new(&header.device, Some(&python), tmp.path().join("native"));
    let mut images = compile_worker(&python, tmp.path());
    let exported = export(
        &exp,
        &results,
        tmp.path(),
        Some(&native),
        Some(&mut images as &mut dyn TritonImages),
    );
    images.shutdown();
    assert!(exported.failed.is_empty(), "{:?}", exported.failed);
    assert!(exported.left_out.is_empty(), "{:?}", exported.left_out);
    let mut folders: Vec<String> = exported
        .folders
        .iter()
        .map(|(p, _)| p.strip_prefix(tmp.path()).unwrap().display().to_string())
        .collect();
    folders.sort();
    assert_eq!(folders, ["aot/N=1024,K=1024", "aot/N=4096,K=4096"]);
    let folder_of = |name: &str| {
        exported
            .folders
            .iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap()
    };
    let (folder, lib) = folder_of("N=4096,K=4096");
    let prefix = &lib.interface.prefix;
    assert_eq!(prefix, "quickstart_N_4096_K_4096");
    assert_eq!(lib.interface.tensors, ["a", "b", "out"]);
    assert_eq!(lib.interface.ints, ["M", "N", "K"]);
    for f in std::fs::read_dir(folder).unwrap().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".cubin") {
            assert_eq!(&std::fs::read(f.path()).unwrap()[..4], b"\x7fELF", "{name}");
        }
    }
    let index = std::fs::read_to_string(folder.join("index.md")).unwrap();
    assert!(index.contains("| `M_LEQ_512` |"), "{index}");
    let index: Json =
        serde_json::from_str(&std::fs::read_to_string(folder.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["prefix"], json!(prefix));
    assert_eq!(index["specs"].as_array().unwrap().len(), lib.specs.len());
    assert_eq!(
        index["buckets"]["M_LEQ_512"],
        json!(lib.buckets["M_LEQ_512"])
    );

    // The winners, independently of the exporter.
    let won = winners(&results, 4096);
    let tuned: Vec<i64> = won.keys().copied().collect();
    assert_eq!(won[&512].method, "cuda");
    assert_eq!(won[&4096].method, "cuda");
    assert_eq!(won[&12288].method, "triton");
    assert_eq!(won[&64].method, "triton");

    // Build and run against the stub driver.
    let build = tmp.path().join("build");
    std::fs::create_dir_all(&build).unwrap();
    std::fs::write(build.join("cuda.h"), STUB_H).unwrap();
    let sizes: Vec<(String, Vec<usize>)> = lib
        .specs
        .iter()
        .map(|s| {
            (
                s.symbol.clone(),
                s.params.iter().map(|p| c_size(&p.c_type)).collect(),
            )
        })
        .collect();
    std::fs::write(build.join("stub.c"), stub_c(&sizes)).unwrap();
    std::fs::write(build.join("main.c"), main_c(prefix)).unwrap();
    let program = build.join("dispatch");
    let cc = Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&build)
        .arg("-I")
        .arg(folder)
        .arg(folder.join(format!("{prefix}.c")))
        .arg(build.join("stub.c"))
        .arg(build.join("main.c"))
        .arg("-o")
        .arg(&program)
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let calls: Vec<(i64, i64)> = [
        1, 16, 24, 64, 100, 511, 512, 700, 4096, 5000, 8191, 8192, 9000, 12288, 20000,
    ]
    .iter()
    .map(|&m| (m, 0))
    .chain([(24, 2), (512, 2), (64, 2)])
    .collect();
    let run = Command::new(&program)
        .args(calls.iter().map(|(m, off)| format!("{m},4096,4096,{off}")))
        .output()
        .unwrap();
    assert!(run.status.success());
    let lines: Vec<Json> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();

    let device = Json::Object(device_fields(&header.device));
    let mut i = 0;
    let mut shared_allowed = std::collections::HashSet::new();
    for (m, off) in &calls {
        let call = &lines[i];
        assert_eq!(call["call"], format!("{m},4096,4096,{off}"));
        i += 1;
        let winner = &won[&lookup(&tuned, *m)];
        let spec = call["spec"].as_i64().unwrap();
        // A Triton image assumed 16-byte aligned pointers: none fits `a + 2`.
        if winner.method == "triton" && *off != 0 {
            assert_eq!(spec, -1, "M={m} misaligned");
            while lines[i].get("result").is_none() {
                i += 1;
            }
            assert_eq!(lines[i]["result"], 500);
            i += 1;
            continue;
        }
        assert!(spec >= 0, "M={m}: no specialisation");
        let chosen = &lib.specs[spec as usize];
        assert_eq!(
            (&chosen.method, &chosen.config),
            (&winner.method, &winner.config),
            "M={m}"
        );
        assert_eq!(chosen.won_at, winner.shape);
        if winner.method == "triton" {
            // Compiled at the tuned M (which is a multiple of 16), or at
            // M + 1 for the Ms that are not: never assuming what M is not.
            let tuned_m = winner.shape["M"].as_i64().unwrap();
            let at = chosen.compiled_at["M"].as_i64().unwrap();
            assert!(
                at == tuned_m || at == tuned_m + 1,
                "M={m}: compiled at {at}"
            );
            if m % 16 != 0 {
                assert_eq!(at, tuned_m + 1, "M={m}");
            }
        }
        // The launch, as the manifest's expressions give it at this shape.
        let mut shape = winner.shape.clone();
        shape.insert("M".into(), json!(m));
        let job = Job {
            id: "x".into(),
            shape_index: 0,
            method: winner.method.clone(),
            shape,
            config: winner.config.clone(),
            baseline: false,
            variant: None,
        };
        let ctx = context(&job, &device);
        let method = exp.method(&winner.method).unwrap();
        let e = |x: &tunelab::manifest::Expr| eval(x, &ctx).unwrap().as_i64().unwrap();
        let (a, b, out) = (0x100000 + off, 0x200000i64, 0x300000i64);
        let (grid, block, params): (Vec<i64>, Vec<i64>, Vec<i64>) = if winner.method == "cuda" {
            let spec = method.native.as_ref().unwrap();
            (
                vec![e(&method.grid[0]), e(&method.grid[1]), 1],
                vec![e(&spec.block[0]), 1, 1],
                vec![a, b, out, *m, 4096, 4096],
            )
        } else {
            let warps = winner.config["num_warps"].as_i64().unwrap();
            let mut p = vec![a, b, out, *m, 4096, 4096, 4096, 4096, 4096];
            // Then Triton's scratch pointers, null.
            p.resize(chosen.params.len(), 0);
            (vec![e(&method.grid[0]), 1, 1], vec![32 * warps, 1, 1], p)
        };
        // Loads and attributes before the launch.
        while lines[i].get("symbol").is_none() || lines[i].get("grid").is_none() {
            if lines[i].get("attribute").is_some() {
                assert_eq!(lines[i]["symbol"], chosen.symbol);
                shared_allowed.insert(chosen.symbol.clone());
            }
            i += 1;
        }
        let launch = &lines[i];
        i += 1;
        assert_eq!(launch["symbol"], chosen.symbol, "M={m}");
        assert_eq!(launch["grid"], json!(grid), "M={m}");
        assert_eq!(launch["block"], json!(block), "M={m}");
        assert_eq!(launch["params"], json!(params), "M={m}");
        if winner.method == "cuda" {
            let smem = e(method.native.as_ref().unwrap().shared_mem.as_ref().unwrap());
            assert_eq!(launch["shared"], smem);
            if smem > 48 * 1024 {
                assert!(
                    shared_allowed.contains(&chosen.symbol),
                    "M={m}: no opt-in to {smem} bytes"
                );
            }
        }
        assert_eq!(lines[i]["result"], 0, "M={m}");
        i += 1;
    }
    assert_eq!(i, lines.len());
    assert!(!shared_allowed.is_empty(), "a winner above 48 KiB opted in");

    // The same source compiles against the real cuda.h (Triton ships one).
    let include = Command::new(&python)
        .args([
            "-c",
            "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'include'))",
        ])
        .output()
        .unwrap();
    let include = PathBuf::from(String::from_utf8(include.stdout).unwrap().trim());
    if include.join("cuda.h").exists() {
        let cc = Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-c", "-o"])
            .arg(build.join("real.o"))
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(folder)
            .arg(folder.join(format!("{prefix}.c")))
            .output()
            .unwrap();
        assert!(
            cc.status.success(),
            "cc with cuda.h: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
    } else {
        eprintln!(
            "note: no cuda.h at {}: compiled against the stub only",
            include.display()
        );
    }
    check_small_folder(&folder_of("N=1024,K=1024").1);
}

/// N = K = 1024: one CUDA and one Triton winner, both in one dispatcher.
fn check_small_folder(lib: &Library) {
    let methods: Vec<&str> = lib.specs.iter().map(|s| s.method.as_str()).collect();
    assert!(
        methods.contains(&"cuda") && methods.contains(&"triton"),
        "{methods:?}"
    );
    let keys: Vec<&str> = lib.buckets.keys().map(String::as_str).collect();
    assert_eq!(keys, ["M_LEQ_32", "M_LEQ_128", "any"]);
}

/// The committed rendering of two libraries (`tests/fixtures/aot/render/`):
/// what the files must be, byte for byte, whatever lays them out.
/// `TUNELAB_BLESS=1` rewrites the fixtures from the code, for a change of
/// layout meant to be made (then review the diff).
const RENDER_FIXTURES: &str = "tests/fixtures/aot/render";

/// `{"M": m, "N": 4096, "K": 4096, "dtype": "bf16"}`
fn gemm_shape(m: i64) -> IndexMap<String, Json> {
    IndexMap::from_iter(
        [
            ("M", json!(m)),
            ("N", json!(4096)),
            ("K", json!(4096)),
            ("dtype", json!("bf16")),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    )
}

fn config(pairs: &[(&str, Json)]) -> IndexMap<String, Json> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn condition(c: &str, text: &str, specialisation: bool) -> Condition {
    Condition {
        c: c.into(),
        text: text.into(),
        specialisation,
    }
}

fn param(name: &str, c_type: &str, value: &str) -> Param {
    Param {
        name: name.into(),
        c_type: c_type.into(),
        value: value.into(),
    }
}

/// Every case the renderer tells apart: a CUDA and two Triton
/// specialisations, two of them sharing an image (one file, one array);
/// an image that is not a whole number of 16-byte lines; compiled at
/// another shape than it won at; no median; no conditions, no parameters;
/// a method name that needs C string escapes (a quote, a backslash, UTF-8),
/// `*/` in a config value, a condition's words and a parameter's name
/// (inside C comments), `|` and a newline in markdown cells; an empty
/// bucket; `M_LEQ`, `M_GEQ` and `any` buckets; winners left out.
fn representative_library() -> Library {
    let p = "fixture_sm_90";
    let fits = |n: &str| {
        condition(
            &format!("({n}) >= INT64_C(-2147483648) && ({n}) <= INT64_C(2147483647)"),
            &format!("`{n}` fits i32"),
            false,
        )
    };
    let image_a: Vec<u8> = (0..37u8).map(|b| b.wrapping_mul(7)).collect();
    let image_b: Vec<u8> = (0..16u8).map(|b| 0xf0 | b).collect();
    let cuda = Spec {
        method: "cuda".into(),
        kind: "cuda".into(),
        job_id: "cuda-512-4096".into(),
        config: config(&[
            ("BLOCK_M", json!(128)),
            ("BLOCK_N", json!(128)),
            ("STAGES", json!(3)),
            ("SMEM", json!(65536)),
        ]),
        compiled_at: gemm_shape(512),
        won_at: gemm_shape(512),
        median_us: Some(20.0),
        image: image_a.clone(),
        symbol: "_Z8gemm_mmaILi128ELi128EEvPKtS1_Ptiii".into(),
        grid: [
            format!("{p}_ceil_div(N, INT64_C(128))"),
            format!("{p}_ceil_div(M, INT64_C(128))"),
            "INT64_C(1)".into(),
        ],
        block: [
            "INT64_C(256)".into(),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        shared: "INT64_C(65536)".into(),
        params: vec![
            param("a", "CUdeviceptr", "a"),
            param("b", "CUdeviceptr", "b"),
            param("out", "CUdeviceptr", "out"),
            param("M", "int32_t", "M"),
            param("N", "int32_t", "N"),
            param("K", "int32_t", "K"),
        ],
        conditions: vec![fits("M"), fits("N"), fits("K")],
    };
    let triton = Spec {
        method: "triton".into(),
        kind: "triton".into(),
        job_id: "triton-127".into(),
        config: config(&[
            ("BLOCK_SIZE_M", json!(64)),
            ("GROUP_SIZE_M", json!(8)),
            ("num_warps", json!(4)),
            ("layout", json!("a*/b")),
        ]),
        compiled_at: gemm_shape(128),
        won_at: gemm_shape(127),
        median_us: Some(4.876),
        image: image_b,
        symbol: "matmul_kernel".into(),
        grid: [
            format!("({p}_ceil_div(M, INT64_C(64)) * {p}_ceil_div(N, INT64_C(64)))"),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        block: [
            "INT64_C(128)".into(),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        shared: "INT64_C(0)".into(),
        params: vec![
            param("a_ptr", "CUdeviceptr", "a"),
            param("M */ rows", "int32_t", "M"),
            param("scale", "float", "0.5f"),
            param("global_scratch", "CUdeviceptr", "0"),
        ],
        conditions: vec![
            condition("(a % 16) == 0", "`a` is 16-byte aligned", true),
            fits("M"),
            condition(
                &format!("{p}_mod(N, INT64_C(16)) == 0"),
                "`N` is a multiple of 16 */ | or not",
                true,
            ),
        ],
    };
    let bare = Spec {
        method: "tri\"ton\\µ".into(),
        kind: "triton".into(),
        job_id: "odd-9000".into(),
        config: IndexMap::new(),
        compiled_at: gemm_shape(9000),
        won_at: gemm_shape(9000),
        median_us: None,
        image: image_a,
        symbol: "empty_kernel".into(),
        grid: [
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        block: [
            "INT64_C(32)".into(),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        shared: "INT64_C(0)".into(),
        params: vec![],
        conditions: vec![],
    };
    Library {
        interface: Interface {
            prefix: p.into(),
            tensors: vec!["a".into(), "b".into(), "out".into()],
            ints: vec!["M".into(), "N".into(), "K".into()],
        },
        specs: vec![cuda, triton, bare],
        buckets: IndexMap::from_iter(
            [
                ("M_LEQ_128", vec![1]),
                ("M_LEQ_512", vec![0]),
                ("M_LEQ_4096", vec![]),
                ("M_GEQ_8192", vec![2, 1]),
                ("any", vec![2]),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        ),
        left_out: vec![
            LeftOut {
                shape: gemm_shape(64),
                method: "cuda".into(),
                job_id: "cuda-64-4096".into(),
                reason: "no image: nvrtc failed | twice\nsee the log".into(),
            },
            LeftOut {
                shape: gemm_shape(2048),
                method: "triton".into(),
                job_id: "triton-2048".into(),
                reason: "`BLOCK_SIZE_M * 2` is not an integer".into(),
            },
        ],
        about: "experiment fixture, NVIDIA H200 (sm_90), run started 2025-06-01T12:00:00Z".into(),
    }
}

/// Nothing to export and no `M` among the integers (which the writer
/// refuses, but the renderer still lays out): empty arrays, no bucket test.
fn empty_library() -> Library {
    Library {
        interface: Interface {
            prefix: "empty_lib".into(),
            tensors: vec!["x".into()],
            ints: vec!["N".into()],
        },
        specs: vec![],
        buckets: IndexMap::from_iter([("any".to_string(), vec![])]),
        left_out: vec![],
        about: "experiment empty".into(),
    }
}

#[test]
fn the_rendered_files_are_the_committed_ones() {
    let bless = std::env::var_os("TUNELAB_BLESS").is_some();
    for (name, lib) in [
        ("representative", representative_library()),
        ("empty", empty_library()),
    ] {
        let dir = repo().join(RENDER_FIXTURES).join(name);
        let files = aot::render(&lib).unwrap();
        // The images are the specs' bytes, each distinct one once.
        let cubins: Vec<&aot::File> = files
            .iter()
            .filter(|f| f.name.ends_with(".cubin"))
            .collect();
        let mut distinct: Vec<&[u8]> = Vec::new();
        for s in &lib.specs {
            if !distinct.contains(&s.image.as_slice()) {
                distinct.push(&s.image);
            }
        }
        assert_eq!(cubins.len(), distinct.len(), "{name}");
        for (n, (f, image)) in cubins.iter().zip(&distinct).enumerate() {
            assert_eq!(f.name, format!("{}_{n}.cubin", lib.interface.prefix));
            assert_eq!(&f.bytes, image, "{name}: {}", f.name);
        }
        let texts: Vec<&aot::File> = files
            .iter()
            .filter(|f| !f.name.ends_with(".cubin"))
            .collect();
        let mut committed: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        committed.sort();
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            for old in &committed {
                std::fs::remove_file(dir.join(old)).unwrap();
            }
            for f in &texts {
                std::fs::write(dir.join(&f.name), &f.bytes).unwrap();
            }
            continue;
        }
        let mut rendered: Vec<String> = texts.iter().map(|f| f.name.clone()).collect();
        rendered.sort();
        assert_eq!(
            rendered, committed,
            "{name}: the files rendered and committed"
        );
        for f in &texts {
            let want = std::fs::read(dir.join(&f.name)).unwrap();
            if f.bytes != want {
                let (got, want) = (
                    String::from_utf8_lossy(&f.bytes),
                    String::from_utf8_lossy(&want),
                );
                let line = got.lines().zip(want.lines()).position(|(g, w)| g != w);
                panic!(
                    "{name}/{} differs from the committed file at line {}:\n  rendered:  {:?}\n  committed: {:?}\n(lines {} and {}; TUNELAB_BLESS=1 rewrites the fixture)",
                    f.name,
                    line.map_or("past the end of one".into(), |l| (l + 1).to_string()),
                    line.and_then(|l| got.lines().nth(l)).unwrap_or(""),
                    line.and_then(|l| want.lines().nth(l)).unwrap_or(""),
                    got.lines().count(),
                    want.lines().count(),
                );
            }
        }
    }
}

/// The committed representative source is C that compiles against the
/// stub driver API with every warning an error.
#[test]
fn the_representative_source_compiles() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("cuda.h"), STUB_H).unwrap();
    for name in ["representative", "empty"] {
        let dir = repo().join(RENDER_FIXTURES).join(name);
        let source = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "c"))
            .unwrap();
        let cc = Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-c", "-o"])
            .arg(tmp.path().join(format!("{name}.o")))
            .arg("-I")
            .arg(tmp.path())
            .arg("-I")
            .arg(&dir)
            .arg(&source)
            .output()
            .expect("cc runs");
        assert!(
            cc.status.success(),
            "cc {name}: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
    }
}
