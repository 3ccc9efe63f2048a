// The decoder layers of a CPU decoding pass in one call: Qwen2 layers (no QK norm) over int8-activation matrices.
//
// Per layer, as DecoderLayer.forward computes it:
//     h = rms_norm(x);  q = rope_write(qkv(h)) (k and v into the cache);  x = x + o(attend(q))
//     h = rms_norm(x);  [gate, up] = gate_up(h);  x = x + down(silu(gate) * up)
// Each step is the very kernel the Python layers call, reached through its address (quant_vnni's or
// quant_maddubs' matmul, glue_cpu's rms_norm and rope_write, attend_cpu's attend), with the same ATen ops
// between them in the same order: the same bits as the Python layers, for every row count.
//
// Why: a step of the 0.5B made ~220 module calls and ~100 small torch ops around its 121 matmuls, ~1.3 ms
// of its ~15 ms (8%) that is neither weight streaming nor arithmetic (docs/results/layers-cpu/).
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
                          const Tensor&, double, int64_t);

// One row block of a matrix in the int8 kernel's panels (QuantWeight.kernel_args).
struct Part {
    Tensor q, h, s, m, sd, md;
    int64_t n, group, bits;
};

// A projection: its row blocks (several where q/k/v differ in format: QuantWeight's Stacked) and its bias.
struct Proj {
    std::vector<Part> parts;
    Tensor bias;

    Tensor apply(Matmul mm, const Tensor& x) const {
        if (parts.size() == 1) {  // QuantWeight.linear: y.add_(bias)
            const Part& p = parts[0];
            Tensor y = mm(x, p.q, p.h, p.s, p.m, p.n, p.group, p.bits, p.sd, p.md);
            return bias.defined() ? y.add_(bias) : y;
        }
        std::vector<Tensor> ys;  // Stacked.linear: the blocks joined, then + bias
        for (const Part& p : parts) ys.push_back(mm(x, p.q, p.h, p.s, p.m, p.n, p.group, p.bits, p.sd, p.md));
        Tensor y = torch::cat(ys, -1);
        return bias.defined() ? y + bias : y;
    }
};

struct Layer {
    Tensor in_norm, post_norm;
    Proj proj[4];  // qkv, o, gate_up, down
};

class Layers {
   public:
    Layers(int64_t matmul, int64_t rms_norm, int64_t rope_write, int64_t attend, int64_t heads, int64_t kv_heads,
           int64_t head_dim, double eps)
        : mm_(reinterpret_cast<Matmul>(matmul)), rms_(reinterpret_cast<RmsNorm>(rms_norm)),
          rope_(reinterpret_cast<RopeWrite>(rope_write)), attend_(reinterpret_cast<Attend>(attend)), H_(heads),
          Hkv_(kv_heads), D_(head_dim), eps_(eps) {
        TORCH_CHECK(matmul && rms_norm && rope_write && attend, "layers_cpu.Layers: a kernel address is 0");
        TORCH_CHECK(heads > 0 && kv_heads > 0 && head_dim > 0, "layers_cpu.Layers: heads ", heads, ", kv heads ",
                    kv_heads, " and head dim ", head_dim, " must be > 0");
    }

    void add_layer(const Tensor& in_norm, const Tensor& post_norm) { layers_.push_back({in_norm, post_norm, {}}); }

    // which: 0 qkv, 1 o, 2 gate_up, 3 down (of the last layer added)
    void add_part(int64_t which, const Tensor& q, const Tensor& h, const Tensor& s, const Tensor& m,
                  const Tensor& sd, const Tensor& md, int64_t n, int64_t group, int64_t bits) {
        TORCH_CHECK(!layers_.empty() && which >= 0 && which < 4, "layers_cpu.add_part: which=", which,
                    " (0-3) after add_layer");
        layers_.back().proj[which].parts.push_back({q, h, s, m, sd, md, n, group, bits});
    }

    void set_bias(int64_t which, const Tensor& bias) {
        TORCH_CHECK(!layers_.empty() && which >= 0 && which < 4, "layers_cpu.set_bias: which=", which,
                    " (0-3) after add_layer");
        layers_.back().proj[which].bias = bias;
    }

    int64_t size() const { return static_cast<int64_t>(layers_.size()); }

    // x [T, d] fp32 after every layer; cos/sin [T, D] at the tokens' positions; k/v: each layer's cache;
    // write_rows/slots: where each token's k and v go; rows/nkeys/first/mask: attend_cpu's plan.
    Tensor run(Tensor x, const Tensor& cos, const Tensor& sin, std::vector<Tensor> k, std::vector<Tensor> v,
               const Tensor& write_rows, const Tensor& slots, const Tensor& rows, const Tensor& nkeys,
               const Tensor& first, const Tensor& mask, double scale) const {
        const int64_t L = size();
        TORCH_CHECK(static_cast<int64_t>(k.size()) == L && static_cast<int64_t>(v.size()) == L,
                    "layers_cpu.run: ", L, " layers but ", k.size(), " k and ", v.size(), " v caches");
        TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                    "layers_cpu.run: x must be contiguous fp32 [T, d], got ", x.sizes(), " ", x.scalar_type());
        const int64_t T = x.size(0);
        for (int64_t i = 0; i < L; ++i) {
            const Layer& l = layers_[i];
            Tensor q = rope_(l.proj[0].apply(mm_, rms_(x, l.in_norm, eps_)), cos, sin, k[i], v[i], write_rows, slots,
                             H_, Hkv_);
            Tensor a = attend_(q, k[i], v[i], rows, nkeys, first, mask, scale, 0);
            x = x + l.proj[1].apply(mm_, a.reshape({T, H_ * D_}));
            auto gate_up = l.proj[2].apply(mm_, rms_(x, l.post_norm, eps_)).chunk(2, -1);
            x = x + l.proj[3].apply(mm_, torch::silu(gate_up[0]) * gate_up[1]);
        }
        return x;
    }

   private:
    Matmul mm_;
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
        .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double>(), py::arg("matmul"),
             py::arg("rms_norm"), py::arg("rope_write"), py::arg("attend"), py::arg("heads"), py::arg("kv_heads"),
             py::arg("head_dim"), py::arg("eps"))
        .def("add_layer", &Layers::add_layer, py::arg("in_norm"), py::arg("post_norm"))
        .def("add_part", &Layers::add_part, py::arg("which"), py::arg("q"), py::arg("h"), py::arg("s"), py::arg("m"),
             py::arg("sd"), py::arg("md"), py::arg("n"), py::arg("group"), py::arg("bits"))
        .def("set_bias", &Layers::set_bias, py::arg("which"), py::arg("bias"))
        .def("__len__", &Layers::size)
        // without the GIL: a pass takes milliseconds, and a server's other threads go on meanwhile
        .def("run", &Layers::run, "x after every layer (see the top)", py::arg("x"), py::arg("cos"), py::arg("sin"),
             py::arg("k"), py::arg("v"), py::arg("write_rows"), py::arg("slots"), py::arg("rows"), py::arg("nkeys"),
             py::arg("first"), py::arg("mask"), py::arg("scale"), py::call_guard<py::gil_scoped_release>());
}
