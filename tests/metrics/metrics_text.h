// The tests' names for metrics/scrape.h: the Prometheus text parser, the series lookup and the
// HTTP GET.
#ifndef TANDEM_TESTS_METRICS_METRICS_TEXT_H_
#define TANDEM_TESTS_METRICS_METRICS_TEXT_H_

#include "metrics/scrape.h"

namespace tandem::testing {

using ::tandem::HttpGet;
using ::tandem::MetricSample;
using ::tandem::MetricValue;
using ::tandem::ParseMetricsText;
using ::tandem::Scrape;

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_METRICS_METRICS_TEXT_H_
