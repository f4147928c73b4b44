"""The ONNX op table, a family a file; importing this package fills ``table.OPS`` (the one
import that does: onnx/importer.py imports it). ``OPS.where(op)`` names an op's file.

    elementwise   math functions, arithmetic, comparisons, logic, Where, Cast
    bitwise       BitShift, Bitwise*, BitCast
    activations   Relu, Sigmoid, Gelu, LeakyRelu, Elu, Selu, Celu, ..., Softmax, Hardmax
    creation      Constant, ConstantOfShape, Range, Shape, Size, EyeLike, OneHot, Trilu
    passthrough   Identity, Dropout, Optional*
    movement      Reshape, Transpose, Concat, Split, Slice, Pad, Expand, Tile, DepthToSpace, ...
    indexing      Gather*, Scatter*, TensorScatter, NonZero, Compress
    sorting       TopK, ArgMax, ArgMin, Unique
    reductions    Reduce*, CumSum, CumProd
    linalg        MatMul, Gemm, Einsum, Det
    conv          Conv, ConvTranspose
    pool          MaxPool, AveragePool, Global*Pool, LpPool
    norm          LayerNormalization, RMSNormalization, BatchNormalization, ..., LRN
    attention     Attention, RotaryEmbedding
    signal        DFT, STFT, MelWeightMatrix, HannWindow, HammingWindow, BlackmanWindow
    resize        Resize, Upsample
    quant         QuantizeLinear, DequantizeLinear, MatMulInteger, QLinearConv, ...
    loss          NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
    contrib       onnxruntime's com.microsoft ops (CONTRIB_OPS): SkipLayerNormalization,
                  FastGelu, FusedMatMul, FusedConv, ...; SimplifiedLayerNormalization
    contrib_attention  com.microsoft Attention, MultiHeadAttention, EmbedLayerNormalization,
                  RotaryEmbedding (contrib_gqa: GroupQueryAttention)
    contrib_quant      com.microsoft MatMulNBits, QGemm, QLinear*, DynamicQuantizeMatMul, ...
    ml            ai.onnx.ml's Binarizer, ArrayFeatureExtractor (and ML_OPS); TfIdfVectorizer
    ml_linear     ai.onnx.ml's LinearClassifier, LinearRegressor
    ml_svm        ai.onnx.ml's SVMClassifier, SVMRegressor
    ml_trees      ai.onnx.ml's TreeEnsembleClassifier, TreeEnsembleRegressor
    ml_tree_ensemble  ai.onnx.ml's TreeEnsemble (opset 5)
    ml_features   ai.onnx.ml's Scaler, Normalizer, OneHotEncoder, Imputer, FeatureVectorizer,
                  ZipMap (ml_scores: what the ml_* predictors share)
    functions     ops the standard defines by a function body (SwiGLU, ...), LinearAttention
    training      ai.onnx.preview.training's Adagrad, Adam, Momentum
    vision        GridSample, AffineGrid, RoiAlign, DeformConv, NonMaxSuppression, Col2Im, ...
"""
from tdag.canonicalize.onnx.ops import (  # noqa: F401
    activations,
    attention,
    bitwise,
    contrib,
    contrib_attention,
    contrib_gqa,
    contrib_quant,
    conv,
    creation,
    elementwise,
    functions,
    indexing,
    linalg,
    loss,
    ml,
    ml_features,
    ml_linear,
    ml_svm,
    ml_tree_ensemble,
    ml_trees,
    movement,
    norm,
    passthrough,
    pool,
    quant,
    reductions,
    resize,
    signal,
    sorting,
    training,
    vision,
)
from tdag.canonicalize.onnx.ops.table import OPS

__all__ = ["OPS"]
