"""``state.i64[k]`` on a compiled :class:`kvsim.policy.hooks.StateRef` loads ONE array.

Without this module numba lowers ``state.i64`` as the structref's generic ``getattr`` of the
whole field: a tuple of 24 arrays, loaded (24 x 7 members) and reference-counted (24
increfs, then 24 decrefs when the tuple dies), before ``[k]`` takes one of them.  LLVM
prunes most of it afterwards, but numba's lowering, LLVM's parsing and its optimisation
passes pay for all of it: the hooks of the built-in policies were 30.3 MB of unoptimised
LLVM IR before this module, 13.4 MB with it, and the same optimised code
(docs/benchmarks.md, "Cold compile": the policy state's groups as a proxy).

Here ``state.<group>`` is typed as a :class:`StateGroup`: a proxy holding only the
structref's meminfo pointer (so NRT counts it like the StateRef itself: one incref, one
decref), and ``group[k]`` computes the address of element ``k`` inside the structref's
payload and loads that one array (borrowed, then incref'd, as numba's tuple ``getitem``
returns it).  Supported on a group: ``g[k]`` with a constant ``k`` (checked when the
function compiles, negative counts from the end) or any integer ``k`` (checked at run time:
``IndexError: tuple index out of range``, as for a tuple), ``len(g)``, and passing ``g``
to another jitted function.  Refused with a typing error that says so: iteration,
unpacking and slices.  Setting a field (``r.i64 = arrays`` in ``hooks._new_ref``) still
takes numba's generic structref ``setattr``, with the field's tuple type.

How the proxy wins over numba's generic structref attribute: numba tries the attribute
templates of a type ordered by target specificity (``BaseContext.
find_matching_getattr_template``); this one is registered for the ``"cpu"`` target, more
specific than the structref's ``"generic"`` one, so it answers ``getattr`` first.
``resolve_setattr`` takes the templates in registration order instead, where structref's
own (registered with the type) comes first and gives the field's tuple type.
"""

from __future__ import annotations

import operator
import sys

from llvmlite import ir
from numba.core import cgutils, errors, types
from numba.core.datamodel import models
from numba.core.extending import lower_builtin, lower_getattr, register_model
from numba.core.imputils import impl_ret_borrowed, impl_ret_untracked
from numba.core.typing.templates import (
    AbstractTemplate,
    AttributeTemplate,
    infer,
    infer_getattr,
    infer_global,
    signature,
)


class StateGroup(types.Type):
    """The numba type of ``state.<group>`` on a compiled StateRef: the structref's meminfo,
    standing for its field ``group`` (a ``UniTuple`` of arrays) without loading it."""

    def __init__(self, ref_type: types.StructRef, group: str):
        self.ref_type = ref_type
        self.group = group
        self.tuple_type = ref_type.field_dict[group]
        self.dtype = self.tuple_type.dtype
        self.count = self.tuple_type.count
        super().__init__(name=f"StateRef.{group}[{self.count} x {self.dtype}]")

    @property
    def key(self):
        return self.ref_type, self.group


@register_model(StateGroup)
class StateGroupModel(models.StructModel):
    """Same layout as numba's ``StructRefModel``: one NRT meminfo pointer."""

    def __init__(self, dmm, fe_type):
        members = [("meminfo", types.MemInfoPointer(fe_type.ref_type.get_data_type()))]
        super().__init__(dmm, fe_type, members)


def _is_group(ref_type, attr: str) -> bool:
    t = ref_type.field_dict.get(attr)
    return isinstance(t, types.UniTuple) and isinstance(t.dtype, types.Array)


def register_group_proxy(struct_typeclass, fields) -> None:
    """Type and lower ``ref.<field>`` as a :class:`StateGroup` for each name of ``fields``
    that is a ``UniTuple`` of arrays in a ``struct_typeclass`` instance (call once, after
    ``structref.register(struct_typeclass)``: see the module docstring for why the order
    matters)."""
    fields = tuple(fields)

    @infer_getattr
    class GroupAttribute(AttributeTemplate):
        key = struct_typeclass
        metadata = {"target": "cpu"}  # more specific than structref's: tried first

        def generic_resolve(self, typ, attr):
            if attr in fields and _is_group(typ, attr):
                return StateGroup(typ, attr)
            return None

    for attr in fields:
        lower_getattr(struct_typeclass, attr)(_group_getattr(attr))


def _group_getattr(attr: str):
    """The lowering of ``ref.<attr>``: the proxy shares the structref's meminfo (one
    incref)."""

    def lower(context, builder, typ, val):
        resty = StateGroup(typ, attr)
        src = cgutils.create_struct_proxy(typ)(context, builder, value=val)
        out = cgutils.create_struct_proxy(resty)(context, builder)
        out.meminfo = src.meminfo
        return impl_ret_borrowed(context, builder, resty, out._getvalue())

    return lower


def _data_ptr(context, builder, meminfo):
    """The payload of the structref whose meminfo is ``meminfo``.  With reference counting
    on, numba's ``NRT_MemInfo_data_fast`` (as structref's own ``getattr``); compiled
    ``_nrt=False``, where numba refuses any NRT call, the same load written out: the
    ``data`` member of NRT's ``MemInfo`` (numba's ``nrtdynmod._meminfo_struct_type``, read,
    not changed).  The caller holds the structref, so the payload lives while it is read."""
    if context.enable_nrt:
        return context.nrt.meminfo_data(builder, meminfo)
    from numba.core.runtime.nrtdynmod import _meminfo_struct_type

    mi = builder.bitcast(meminfo, _meminfo_struct_type.as_pointer())
    return builder.load(cgutils.gep(builder, mi, 0, 3))


def _payload(context, builder, ref_type, val):
    """The struct proxy of structref ``val``'s payload (its fields by name)."""
    src = cgutils.create_struct_proxy(ref_type)(context, builder, value=val)
    data_t = ref_type.get_data_type()
    alloc_t = context.data_model_manager[data_t].get_value_type()
    data_ptr = builder.bitcast(_data_ptr(context, builder, src.meminfo), alloc_t.as_pointer())
    return cgutils.create_struct_proxy(data_t)(context, builder, ref=data_ptr)


def register_borrowed_members(struct_typeclass, fields) -> None:
    """Lower ``ref.<field>`` for each name of ``fields`` of a ``struct_typeclass`` structref
    so that it also compiles in a function compiled ``_nrt=False`` (numba's generic
    structref ``getattr`` asks NRT for the payload, which such a function refuses): the
    member is loaded from the payload and returned borrowed (a reference counted only where
    counting is on, exactly as numba's own lowering; :func:`_data_ptr`).  A lowering
    registered for an attribute name is found before the structref's generic one
    (``BaseContext.get_getattr``); the typing stays the structref's."""
    for attr in tuple(fields):
        lower_getattr(struct_typeclass, attr)(_member_getattr(attr))


def _member_getattr(attr: str):
    def lower(context, builder, typ, val):
        value = getattr(_payload(context, builder, typ, val), attr)
        return impl_ret_borrowed(context, builder, typ.field_dict[attr], value)

    return lower


def _element_ptr(context, builder, grp_t: StateGroup, grp, idx):
    """Pointer to element ``idx`` (an ``intp`` value, in range) of the group's field
    inside the structref's payload."""
    proxy = cgutils.create_struct_proxy(grp_t)(context, builder, value=grp)
    data_t = grp_t.ref_type.get_data_type()
    alloc_t = context.data_model_manager[data_t].get_value_type()
    data_ptr = builder.bitcast(_data_ptr(context, builder, proxy.meminfo),
                               alloc_t.as_pointer())
    payload = cgutils.create_struct_proxy(data_t)(context, builder, ref=data_ptr)
    field_ptr = payload._get_ptr_by_name(grp_t.group)  # -> [count x array data]
    return builder.gep(field_ptr, [ir.Constant(ir.IntType(32), 0), idx], inbounds=True)


def _load(context, builder, grp_t: StateGroup, ptr):
    """The array at ``ptr``, as a new reference.  An array's data and value
    representations are the same LLVM struct: one aggregate load (numba's
    ``StructModel.load_from_data_pointer`` loads and reassembles it member by member)."""
    model = context.data_model_manager[grp_t.dtype]
    if model.get_data_type() == model.get_value_type():
        value = builder.load(ptr)
    else:
        value = model.load_from_data_pointer(builder, ptr)
    return impl_ret_borrowed(context, builder, grp_t.dtype, value)


# ---- typing ---------------------------------------------------------------------------

def _refuse(what: str, grp: StateGroup):
    raise errors.TypingError(
        f"{what} of {grp.name} is not supported in compiled code: index it "
        f"(state.{grp.group}[k], k a constant or an integer) or pass it whole to a "
        f"jitted function")


@infer
class StaticGetItemGroup(AbstractTemplate):
    """``group[3]``, ``group[-1]``: the index is checked when the function compiles."""
    key = "static_getitem"

    def generic(self, args, kws):
        grp, idx = args
        if not isinstance(grp, StateGroup):
            return None
        if isinstance(idx, slice):
            _refuse("a slice", grp)
        if isinstance(idx, int):
            if not -grp.count <= idx < grp.count:
                raise errors.NumbaIndexError(
                    f"state.{grp.group}[{idx}]: index out of range (the group holds "
                    f"{grp.count} arrays, kvsim.policy.api.STATE_*)")
            return signature(grp.dtype, *args)
        return None


@infer_global(operator.getitem)
class GetItemGroup(AbstractTemplate):
    """``group[i + 1]``: any integer index, checked at run time."""

    def generic(self, args, kws):
        if len(args) != 2 or not isinstance(args[0], StateGroup):
            return None
        grp, idx = args
        if isinstance(idx, types.Integer):
            return signature(grp.dtype, grp, types.intp)
        if isinstance(idx, (types.SliceType, types.SliceLiteral)):
            _refuse("a slice", grp)
        return None


@infer
class GetIterGroup(AbstractTemplate):
    """Iterating a group is refused (with a message, instead of numba's generic one)."""
    key = "getiter"

    def generic(self, args, kws):
        if len(args) == 1 and isinstance(args[0], StateGroup):
            _refuse("iteration", args[0])
        return None


@infer_global(len)
class LenGroup(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 1 and isinstance(args[0], StateGroup):
            return signature(types.intp, args[0])
        return None


# ---- lowering -------------------------------------------------------------------------

@lower_builtin("static_getitem", StateGroup, types.IntegerLiteral)
def _static_getitem(context, builder, sig, args):
    grp_t = sig.args[0]
    grp, idx = args
    idx = idx + grp_t.count if idx < 0 else idx
    ptr = _element_ptr(context, builder, grp_t, grp, context.get_constant(types.intp, idx))
    return _load(context, builder, grp_t, ptr)


@lower_builtin(operator.getitem, StateGroup, types.intp)
def _getitem(context, builder, sig, args):
    grp_t = sig.args[0]
    grp, idx = args
    n = context.get_constant(types.intp, grp_t.count)
    idx = builder.select(builder.icmp_signed("<", idx, idx.type(0)), builder.add(idx, n), idx)
    out_of_range = builder.or_(builder.icmp_signed("<", idx, idx.type(0)),
                               builder.icmp_signed(">=", idx, n))
    with builder.if_then(out_of_range, likely=False):
        context.call_conv.return_user_exc(builder, IndexError, ("tuple index out of range",))
    return _load(context, builder, grp_t, _element_ptr(context, builder, grp_t, grp, idx))


@lower_builtin(len, StateGroup)
def _len(context, builder, sig, args):
    return impl_ret_untracked(context, builder, sig.return_type,
                              context.get_constant(types.intp, sig.args[0].count))


# ---- named state: ``state = SPEC.of(state)`` then ``state.t1`` --------------------------
#
# A policy declares the names of its arrays once (:class:`kvsim.policy.api.StateSpec`).  The
# compiled core still passes every policy's state as the ONE StateRef type (one core, one
# hook signature); inside a hook, ``SPEC.of(state)`` reinterprets that StateRef as a
# :class:`NamedState` of this spec: the same meminfo pointer (one incref), typed with the
# spec's names, so ``state.t1`` loads one array from the struct exactly as
# ``state.i64[2]`` does (the same ``_element_ptr`` / ``_load``), and ``state.ghosts`` (a
# name that stands for n consecutive arrays) builds the tuple of those n arrays.

class StateSpecType(types.Type):
    """The numba type of a :class:`kvsim.policy.api.StateSpec` global: a compile-time
    constant carrying the spec's layout, no run-time data."""

    def __init__(self, layout: tuple):
        self.layout = layout
        super().__init__(name=f"StateSpec{layout}")

    @property
    def key(self):
        return self.layout


class NamedState(types.Type):
    """A StateRef seen through a spec's names: ``layout`` is a tuple of ``(name, group,
    start, n)`` (``n == 0``: one array ``group[start]``; else the tuple of ``n`` arrays
    ``group[start:start + n]``)."""

    def __init__(self, ref_type: types.StructRef, layout: tuple):
        self.ref_type = ref_type
        self.layout = layout
        self.by_name = {name: (group, start, n) for name, group, start, n in layout}
        super().__init__(name=f"NamedState{tuple(e[0] for e in layout)}")

    @property
    def key(self):
        return self.ref_type, self.layout


register_model(StateSpecType)(models.OpaqueModel)


@register_model(NamedState)
class NamedStateModel(models.StructModel):
    """One NRT meminfo pointer: the StateRef's own."""

    def __init__(self, dmm, fe_type):
        members = [("meminfo", types.MemInfoPointer(fe_type.ref_type.get_data_type()))]
        super().__init__(dmm, fe_type, members)


_GROUPS = ("i64", "f64", "i8", "i64_2d")
_SPECS: dict = {}  # layout -> a StateSpec with it (its namedtuple class)


def _tuple_view(spec):
    """``STATE.of(policy_state)`` in compiled code given a PolicyState namedtuple (not a
    StateRef): the spec's namedtuple of the same arrays, as the interpreted ``of``."""
    parts = [f"ref.{g}[{k}]" if n == 0 else
             "(" + "".join(f"ref.{g}[{k + j}], " for j in range(n)) + ")"
             for _, g, k, n in spec.layout] + [f"ref.{g}" for g in _GROUPS]
    ns = {"cls": spec._cls}
    exec(f"def impl(spec, ref):\n    return cls({', '.join(parts)})\n", ns)
    return ns["impl"]


def register_named_state(ref_typeclass, spec_class) -> None:
    """Make ``spec.of(ref)`` compile for a ``spec_class`` global and a ``ref_typeclass``
    value, and ``named.<name>`` on the result (call once, from kvsim.policy.hooks)."""
    from numba.core import ir_utils
    from numba.core.extending import intrinsic, overload_method, typeof_impl
    from numba.core.imputils import lower_constant, lower_getattr_generic

    @typeof_impl.register(spec_class)
    def _typeof_spec(val, c):
        _declare_alias(val)
        _SPECS.setdefault(val.layout, val)
        return StateSpecType(val.layout)

    @lower_constant(StateSpecType)
    def _spec_constant(context, builder, ty, pyval):
        return context.get_dummy_value()

    @intrinsic
    def _reinterpret(typingctx, ref, spec):
        if not isinstance(ref, ref_typeclass) or not isinstance(spec, StateSpecType):
            return None
        resty = NamedState(ref, spec.layout)

        def codegen(context, builder, sig, args):
            src = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
            out = cgutils.create_struct_proxy(resty)(context, builder)
            out.meminfo = src.meminfo
            return impl_ret_borrowed(context, builder, resty, out._getvalue())

        return signature(resty, ref, spec), codegen

    # numba's dead-code elimination drops a store into an array it believes is a fresh
    # object nobody reads afterwards: ``state.glist[b] = 1`` after ``state =
    # STATE.of(state)`` is one unless ``STATE.of``'s result is declared an alias of its
    # argument (as a getattr of an argument is).  numba names the call by the global it
    # is made on (``("of", "<module>.<global name>")`` before ``of`` is inlined,
    # ``("_reinterpret", this module)`` after): declared when the spec is typed.
    def _alias(lhs, args, alias_map, arg_aliases):
        ir_utils._add_alias(lhs, args[0].name, alias_map, arg_aliases)

    ir_utils.alias_func_extensions[("_reinterpret", __name__)] = _alias

    def _declare_alias(spec):
        module = sys.modules.get(getattr(spec, "module", None) or "")
        for name, value in vars(module).items() if module is not None else ():
            if value is spec:
                ir_utils.alias_func_extensions[("of", f"{module.__name__}.{name}")] = _alias

    @overload_method(StateSpecType, "of")
    def _of(spec, ref):
        if isinstance(ref, ref_typeclass):
            return lambda spec, ref: _reinterpret(ref, spec)
        if isinstance(ref, NamedState) and ref.layout == spec.layout:
            return lambda spec, ref: ref
        if isinstance(ref, types.BaseNamedTuple) and ref.fields == _GROUPS \
                and spec.layout in _SPECS:  # a PolicyState itself (tests call hooks so)
            return _tuple_view(_SPECS[spec.layout])
        if isinstance(ref, types.BaseNamedTuple) and spec.layout in _SPECS \
                and ref.fields == _SPECS[spec.layout]._cls._fields:  # already that view:
            return lambda spec, ref: ref  # a hook passing its view to another hook
        return None

    @infer_getattr
    class NamedAttribute(AttributeTemplate):
        key = NamedState

        def generic_resolve(self, typ, attr):
            if attr in typ.by_name:
                group, _, n = typ.by_name[attr]
                arr = typ.ref_type.field_dict[group].dtype
                return arr if n == 0 else types.UniTuple(arr, n)
            if _is_group(typ.ref_type, attr):
                return StateGroup(typ.ref_type, attr)
            return None

    @lower_getattr_generic(NamedState)
    def _named_getattr(context, builder, typ, val, attr):
        src = cgutils.create_struct_proxy(typ)(context, builder, value=val)
        group = attr if attr not in typ.by_name else typ.by_name[attr][0]
        grp_t = StateGroup(typ.ref_type, group)
        grp = cgutils.create_struct_proxy(grp_t)(context, builder)
        grp.meminfo = src.meminfo
        grp = grp._getvalue()
        if attr not in typ.by_name:  # state.i64 etc: the group proxy
            return impl_ret_borrowed(context, builder, grp_t, grp)
        _, start, n = typ.by_name[attr]

        def one(k):
            ptr = _element_ptr(context, builder, grp_t, grp, context.get_constant(types.intp, k))
            return _load(context, builder, grp_t, ptr)

        if n == 0:
            return one(start)
        tup_t = types.UniTuple(grp_t.dtype, n)
        return context.make_tuple(builder, tup_t, [one(start + k) for k in range(n)])
