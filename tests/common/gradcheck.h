// Finite-difference gradient checks in f64: central differences of a scalar loss with respect to
// every element of a tensor (or a seeded random subset of at most max_elements), compared with
// the analytic gradient as a whole-tensor relative RMS error (testing::compare).
#pragma once
#include <functional>
#include <string>

#include "tests/common/testing.h"

namespace engine::testing {

// theta: f64 CPU tensor the loss reads; analytic: its gradient (same numel).
Comparison finite_difference_check(const std::function<double()>& loss, const Tensor& theta,
                                   const Tensor& analytic, const std::string& what,
                                   int64_t max_elements = 400, double eps = 1e-5);

// sum(a * b) in f64 for two CPU float tensors of equal numel (a random projection loss).
double dot(const Tensor& a, const Tensor& b);

}  // namespace engine::testing
