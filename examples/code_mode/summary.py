# What a model would write: join two tools' results in code, return only the answer.
import tools

rows = []
for customer in tools.crm.list_customers(country="US"):
    amounts = tools.billing.invoices(customer_id=customer["id"])
    rows.append({"name": customer["name"], "invoices": len(amounts), "total": sum(amounts)})
rows.sort(key=lambda r: r["total"], reverse=True)
{"customers": len(rows), "revenue": sum(r["total"] for r in rows), "top": rows[0]["name"], "rows": rows}
