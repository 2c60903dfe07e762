# The engine's warm-up of its zygotes (ZygoteSpec::warm_up), run once in each right after its
# preloads: where matplotlib.pyplot is preloaded, a first chart is drawn, so that the fonts
# are loaded and the text and Agg renderer caches filled, which every first chart of a
# process pays, paid once here. Its rehearsal draws it again in the fork the zygote surveys:
# the pages a first chart writes are among those each child copies while it waits for its
# request.
import sys


def chart():
    # What data agents draw: a frame's plot when pandas is loaded, saved as a PNG.
    import io

    plt = sys.modules["matplotlib.pyplot"]
    fig, ax = plt.subplots()
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        frame = pandas.DataFrame({"x": range(100), "y": [v * v for v in range(100)]})
        frame.plot(x="x", y="y", ax=ax, title="x")
    else:
        ax.plot([0, 1], [0, 1], label="x")
        ax.set_title("x")
        ax.legend()
    fig.savefig(io.BytesIO(), format="png")
    plt.close("all")


if "matplotlib.pyplot" in sys.modules:
    try:
        chart()
    except Exception as e:
        print("airlock zygote: warming matplotlib: %r" % e, file=sys.stderr, flush=True)
    else:
        __zygote_rehearse__ = chart
