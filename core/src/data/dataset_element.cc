// SPDX-License-Identifier: Apache-2.0
// strata::Element: the named tensors of one dataset element.
#include "strata/data.hpp"

#include <string>
#include <utility>

#include "strata/c/input.h"

namespace strata {

namespace {

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "(none)" : s;
}

}  // namespace

Element& Element::add(std::string name, Tensor t) {
  STRATA_ENFORCE(!name.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "Element::add: the component name is empty; give every component a name");
  STRATA_ENFORCE(t.defined(), STRATA_ERR_INVALID_ARGUMENT, "Element::add: component '", name,
                 "' is an empty Tensor; pass a tensor with data");
  for (const std::string& n : names)
    STRATA_ENFORCE(n != name, STRATA_ERR_INVALID_ARGUMENT, "Element::add: a component named '", name,
                   "' already exists; component names must be unique");
  STRATA_ENFORCE(tensors.size() < STRATA_ELEMENT_MAX_COMPONENTS, STRATA_ERR_INVALID_ARGUMENT,
                 "Element::add: cannot add '", name, "': an element holds at most ", STRATA_ELEMENT_MAX_COMPONENTS,
                 " components; pack several into one tensor");
  names.push_back(std::move(name));
  tensors.push_back(std::move(t));
  return *this;
}

Tensor& Element::operator[](const std::string& name) {
  for (std::size_t i = 0; i < names.size() && i < tensors.size(); ++i)
    if (names[i] == name) return tensors[i];
  STRATA_THROW(STRATA_ERR_NOT_FOUND, "element has no component '", name, "'; its components are: ", name_list(names));
}

const Tensor& Element::operator[](const std::string& name) const { return const_cast<Element&>(*this)[name]; }

Element Element::clone() const {
  Element e;
  e.names = names;
  e.tensors.reserve(tensors.size());
  for (const Tensor& t : tensors) e.tensors.push_back(t.defined() ? t.clone() : Tensor());
  return e;
}

const char* auto_shard_policy_name(AutoShardPolicy p) {
  switch (p) {
    case AutoShardPolicy::AUTO:
      return "AUTO";
    case AutoShardPolicy::FILE:
      return "FILE";
    case AutoShardPolicy::DATA:
      return "DATA";
    case AutoShardPolicy::OFF:
      return "OFF";
    case AutoShardPolicy::HINT:
      return "HINT";
  }
  return "UNKNOWN";
}

}  // namespace strata
