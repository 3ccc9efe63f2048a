// The decoder layers of a CPU decoding pass in one call: Qwen2 and Qwen3 layers over quantized matrices (int8
// activations), fp32 panels (skinny_gemm) or oneDNN-blocked fp32/bf16 weights (d3d.cpu.linear).
//
// Per layer, as DecoderLayer.forward computes it:
//     h = rms_norm(x);  qkv = qkv(h);  Qwen3: q and k heads rms_norm'd, times their weights
//     q = rope_write(qkv) (k and v into the cache);  x = x + o(attend(q) in x's dtype)
//     h = rms_norm(x);  [gate, up] = gate_up(h);  x = x + down(silu(gate) * up)
// Each step is the very kernel the Python layers call, reached through its address (quant_vnni's or
// quant_maddubs' matmul, skinny_gemm's matmul, glue_cpu's rms_norm and rope_write, attend_cpu's attend) or
// through the dispatcher (oneDNN's linear), with the same ATen ops between them in the same order: the same
// bits as the Python layers, for every row count. (Qwen3's Python layers rotate q and k with apply_rope and
// write the cache with PassLayout.write; rope_write does the same in the same fp32 ops, tests/test_glue_cpu.py.)
//
// Why: a step of the 0.5B made ~220 module calls and ~100 small torch ops around its 121 matmuls; in one call
// the step took 11.6 ms where it had taken 13.8, the bundled target's 2.2 where 4.0 (docs/results/layers-cpu/).
// Torch reference: DecoderLayer.forward (tests/test_layers_cpu.py compares them bit for bit).
#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace {

using torch::Tensor;
using Matmul = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t,
                          int64_t, const Tensor&, const Tensor&);
using RmsNorm = Tensor (*)(const Tensor&, const Tensor&, double);
using RopeWrite = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, const Tensor&,
                             const Tensor&, int64_t, int64_t);
using Attend = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, double, int64_t, int64_t);
using Panels = Tensor (*)(const Tensor&, const Tensor&, int64_t);

enum Kind : int64_t { INT8 = 0, PANELS = 1, ONEDNN = 2 };

// d3d.cpu.linear.PackedWeight: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
Tensor onednn_linear(const Tensor& x, const Tensor& packed, const Tensor& bias) {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    torch::jit::Stack stack{x, packed, bias.defined() ? c10::IValue(bias) : c10::IValue(), std::string("none"),
                            c10::List<std::optional<c10::Scalar>>(), c10::IValue(std::string(""))};
    op.callBoxed(&stack);
    return stack[0].toTensor();
}

// One row block of a matrix: the int8 kernel's panels (QuantWeight.kernel_args; q h s m sd md n group bits),
// skinny_gemm's fp32 panels (q, n) or a oneDNN-blocked weight (q).
struct Part {
    int64_t kind;
    Tensor q, h, s, m, sd, md;
    int64_t n, group, bits;
};

struct Kernels {
    Matmul int8;
    Panels panels;
};

// A projection: its row blocks (several where q/k/v differ in format: QuantWeight's Stacked) and its bias.
struct Proj {
    std::vector<Part> parts;
    Tensor bias;

    Tensor apply(const Kernels& k, const Tensor& x) const {
        if (parts.size() == 1) {
            const Part& p = parts[0];
            if (p.kind == ONEDNN) return onednn_linear(x, p.q, bias);  // PackedWeight: the bias inside
            // QuantWeight.linear: y.add_(bias); PanelWeight: y += bias
            Tensor y = p.kind == PANELS ? k.panels(x, p.q, p.n)
                                        : k.int8(x, p.q, p.h, p.s, p.m, p.n, p.group, p.bits, p.sd, p.md);
            return bias.defined() ? y.add_(bias) : y;
        }
        std::vector<Tensor> ys;  // Stacked.linear (int8 blocks): the blocks joined, then + bias
        for (const Part& p : parts) ys.push_back(k.int8(x, p.q, p.h, p.s, p.m, p.n, p.group, p.bits, p.sd, p.md));
        Tensor y = torch::cat(ys, -1);
        return bias.defined() ? y + bias : y;
    }
};

struct Layer {
    Tensor in_norm, post_norm, qk_norm;  // qk_norm: Qwen3's [H + Hkv, D] head weights (undefined: Qwen2)
    Proj proj[4];                         // qkv, o, gate_up, down
};

class Layers {
   public:
    Layers(int64_t matmul, int64_t panels, int64_t rms_norm, int64_t rope_write, int64_t attend, int64_t heads,
           int64_t kv_heads, int64_t head_dim, double eps)
        : k_{reinterpret_cast<Matmul>(matmul), reinterpret_cast<Panels>(panels)},
          rms_(reinterpret_cast<RmsNorm>(rms_norm)), rope_(reinterpret_cast<RopeWrite>(rope_write)),
          attend_(reinterpret_cast<Attend>(attend)), H_(heads), Hkv_(kv_heads), D_(head_dim), eps_(eps) {
        TORCH_CHECK(rms_norm && rope_write && attend, "layers_cpu.Layers: a kernel address is 0");
        TORCH_CHECK(heads > 0 && kv_heads > 0 && head_dim > 0, "layers_cpu.Layers: heads ", heads, ", kv heads ",
                    kv_heads, " and head dim ", head_dim, " must be > 0");
    }

    // qk_norm: Qwen3's q and k head weights [H + Hkv, D] (empty: Qwen2)
    void add_layer(const Tensor& in_norm, const Tensor& post_norm, const Tensor& qk_norm) {
        TORCH_CHECK(qk_norm.numel() == 0 || qk_norm.sizes() == torch::IntArrayRef({H_ + Hkv_, D_}),
                    "layers_cpu.add_layer: qk_norm must be [", H_ + Hkv_, ", ", D_, "] or empty, got ",
                    qk_norm.sizes());
        layers_.push_back({in_norm, post_norm, qk_norm.numel() ? qk_norm : Tensor(), {}});
    }

    // which: 0 qkv, 1 o, 2 gate_up, 3 down (of the last layer added); kind: 0 int8 panels, 1 fp32 panels,
    // 2 oneDNN-blocked (see Part)
    void add_part(int64_t which, int64_t kind, const Tensor& q, const Tensor& h, const Tensor& s, const Tensor& m,
                  const Tensor& sd, const Tensor& md, int64_t n, int64_t group, int64_t bits) {
        TORCH_CHECK(!layers_.empty() && which >= 0 && which < 4, "layers_cpu.add_part: which=", which,
                    " (0-3) after add_layer");
        TORCH_CHECK(kind == INT8 ? k_.int8 != nullptr : kind == PANELS ? k_.panels != nullptr : kind == ONEDNN,
                    "layers_cpu.add_part: kind=", kind, " (0 int8, 1 fp32 panels, 2 oneDNN) without its kernel");
        auto& parts = layers_.back().proj[which].parts;
        TORCH_CHECK(parts.empty() || (kind == INT8 && parts[0].kind == INT8),
                    "layers_cpu.add_part: only int8 blocks stack");
        parts.push_back({kind, q, h, s, m, sd, md, n, group, bits});
    }

    void set_bias(int64_t which, const Tensor& bias) {
        TORCH_CHECK(!layers_.empty() && which >= 0 && which < 4, "layers_cpu.set_bias: which=", which,
                    " (0-3) after add_layer");
        layers_.back().proj[which].bias = bias;
    }

    int64_t size() const { return static_cast<int64_t>(layers_.size()); }

    // x [T, d] (fp32, or bf16 for oneDNN weights) after every layer; cos/sin [T, D] at the tokens' positions;
    // k/v: each layer's cache; write_rows/slots: where each token's k and v go; rows/nkeys/first/mask: attend_cpu's
    // plan; keep: the rows the last layer carries on past attention, in this order (the others only write their
    // K/V), or none: every row.
    Tensor run(Tensor x, const Tensor& cos, const Tensor& sin, std::vector<Tensor> k, std::vector<Tensor> v,
               const Tensor& write_rows, const Tensor& slots, const Tensor& rows, const Tensor& nkeys,
               const Tensor& first, const Tensor& mask, double scale, const c10::optional<Tensor>& keep) const {
        const int64_t L = size();
        TORCH_CHECK(static_cast<int64_t>(k.size()) == L && static_cast<int64_t>(v.size()) == L,
                    "layers_cpu.run: ", L, " layers but ", k.size(), " k and ", v.size(), " v caches");
        TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
                        x.is_contiguous(),
                    "layers_cpu.run: x must be contiguous fp32 or bf16 [T, d], got ", x.sizes(), " ", x.scalar_type());
        const int64_t T = x.size(0), QK = (H_ + Hkv_) * D_;
        for (int64_t i = 0; i < L; ++i) {
            const Layer& l = layers_[i];
            Tensor qkv = l.proj[0].apply(k_, rms_(x, l.in_norm, eps_));
            if (l.qk_norm.defined()) {  // Attention.qkv: per-head RMSNorm of q and k, then each head's weight
                Tensor qk = rms_(qkv.narrow(1, 0, QK).view({T, H_ + Hkv_, D_}), Tensor(), eps_) * l.qk_norm;
                qkv = torch::cat({qk.view({T, QK}), qkv.narrow(1, QK, Hkv_ * D_)}, 1);
            }
            Tensor q = rope_(qkv, cos, sin, k[i], v[i], write_rows, slots, H_, Hkv_);
            Tensor a = attend_(q, k[i], v[i], rows, nkeys, first, mask, scale, 0, 0).reshape({T, H_ * D_});
            if (keep.has_value() && i == L - 1) {  // DecoderLayer.forward's keep
                a = a.index_select(0, *keep);
                x = x.index_select(0, *keep);
            }
            x = x + l.proj[1].apply(k_, a.to(x.scalar_type()));
            auto gate_up = l.proj[2].apply(k_, rms_(x, l.post_norm, eps_)).chunk(2, -1);
            x = x + l.proj[3].apply(k_, torch::silu(gate_up[0]) * gate_up[1]);
        }
        return x;
    }

   private:
    Kernels k_;
    RmsNorm rms_;
    RopeWrite rope_;
    Attend attend_;
    int64_t H_, Hkv_, D_;
    double eps_;
    std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    py::class_<Layers>(m, "Layers")
        .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double>(),
             py::arg("matmul"), py::arg("panels"), py::arg("rms_norm"), py::arg("rope_write"), py::arg("attend"),
             py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"))
        .def("add_layer", &Layers::add_layer, py::arg("in_norm"), py::arg("post_norm"), py::arg("qk_norm"))
        .def("add_part", &Layers::add_part, py::arg("which"), py::arg("kind"), py::arg("q"), py::arg("h"),
             py::arg("s"), py::arg("m"), py::arg("sd"), py::arg("md"), py::arg("n"), py::arg("group"), py::arg("bits"))
        .def("set_bias", &Layers::set_bias, py::arg("which"), py::arg("bias"))
        .def("__len__", &Layers::size)
        // without the GIL: a pass takes milliseconds, and a server's other threads go on meanwhile
        .def("run", &Layers::run, "x after every layer (see the top)", py::arg("x"), py::arg("cos"), py::arg("sin"),
             py::arg("k"), py::arg("v"), py::arg("write_rows"), py::arg("slots"), py::arg("rows"), py::arg("nkeys"),
             py::arg("first"), py::arg("mask"), py::arg("scale"), py::arg("keep") = py::none(),
             py::call_guard<py::gil_scoped_release>());
}
